"""The GPU check: fleetrun against a plain PyTorch loop, on one machine with an NVIDIA GPU.

    python3 bench/gpu_check.py [--images N] [--batch B] [--bin-dir DIR] [--work DIR]

Writes N images (3x224x224 float16 arrays, `.npy`, random, nothing downloaded) into
`bench/work/gpu/images/`, then over the same files, with the same model and mini-batch size:

1. a plain loop: one process loads each mini-batch's files, stacks them and runs the
   model on the GPU (the fastest a single process does it);
2. `fleetrun run` of the same model as an entry script (`gpu_score.py`, written beside the
   images), with one runner per GPU;

and prints images per second for each, their ratio, the GPU-busy split `job_result.txt`
gives (when this build writes one), and what NVML saw while fleetrun ran (`nvidia-smi`
sampled every half second: mean utilisation and peak memory per GPU). The model is a small
convolutional network with random weights: the check measures feeding a GPU, not a model.

Exit status: 0 when both sides ran and wrote one row per image; 1 when a side failed or the
outputs differ; 2 when there is no CUDA device (the check says so and runs nothing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The model and scoring both sides run: one definition, imported by the loop and written out
# as the entry script fleetrun runs.
SCORE_SCRIPT = '''\
import os
import numpy as np
import torch
from torch import nn

model = None
device = None


def build():
    torch.manual_seed(0)
    layers = []
    channels = 3
    for width in (32, 64, 128, 256):
        layers += [nn.Conv2d(channels, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
        channels = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 1000)]
    return nn.Sequential(*layers).eval()


def init():
    global model, device
    device = torch.device("cuda")
    model = build().to(device).half()


def run(mini_batch):
    batch = np.stack([np.load(path) for path in mini_batch])
    with torch.inference_mode():
        scores = model(torch.from_numpy(batch).to(device, non_blocking=True))
        classes = scores.argmax(dim=1).tolist()
    return [f"{os.path.basename(path)} {c}" for path, c in zip(mini_batch, classes)]
'''

JOB = '''\
name = "gpu-check"
entry_script = "gpu_score.py"
output_action = "append_row"
append_row_file_name = "scores.txt"
mini_batch_size = {batch}
process_count_per_node = {gpus}
error_threshold = 0
run_invocation_timeout = 300
{environment}
[input]
files = "{images}"

[output]
path = "{output}"
'''


def cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: the GPU check needs it (pip install torch).")
        return 0
    if not torch.cuda.is_available():
        print("No CUDA device: the GPU check runs only where an NVIDIA GPU is.")
        return 0
    return torch.cuda.device_count()


def write_images(folder: str, count: int) -> list[str]:
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    names = [f"img-{i:06d}.npy" for i in range(count)]
    present = set(os.listdir(folder))
    rng = np.random.default_rng(0)
    for name in names:
        if name not in present:
            np.save(os.path.join(folder, name), rng.standard_normal((3, 224, 224), dtype=np.float32).astype(np.float16))
    return [os.path.join(folder, name) for name in names]


def plain_loop(work: str, files: list[str], batch: int) -> tuple[float, list[str]]:
    """Images per second of one process looping over the mini-batches, and its rows."""
    sys.path.insert(0, work)
    import gpu_score  # written by main()
    import torch

    gpu_score.init()
    gpu_score.run(files[:batch])  # warm-up: cuDNN picks its kernels once
    torch.cuda.synchronize()
    rows: list[str] = []
    started = time.perf_counter()
    for i in range(0, len(files), batch):
        rows += gpu_score.run(files[i : i + batch])
    torch.cuda.synchronize()
    return len(files) / (time.perf_counter() - started), rows


class Nvml:
    """`nvidia-smi` sampled every half second while fleetrun runs."""

    def __init__(self) -> None:
        self.samples: list[tuple[int, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        query = ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.wait(0.5):
            try:
                out = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.TimeoutExpired):
                return
            for line in out.strip().splitlines():
                index, util, used = (part.strip() for part in line.split(","))
                self.samples.append((int(index), float(util), float(used)))

    def __enter__(self) -> "Nvml":
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def summary(self) -> list[str]:
        lines = []
        for gpu in sorted({s[0] for s in self.samples}):
            mine = [s for s in self.samples if s[0] == gpu]
            mean = sum(s[1] for s in mine) / len(mine)
            peak = max(s[2] for s in mine)
            lines.append(f"GPU {gpu}: utilisation {mean:.0f}% on average, memory {peak:.0f} MiB at most ({len(mine)} samples)")
        return lines or ["nvidia-smi gave no samples"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bin-dir", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release"))
    parser.add_argument("--work", default=os.path.join(HERE, "work", "gpu"))
    args = parser.parse_args()

    gpus = cuda_devices()
    if gpus == 0:
        return 2
    fleetrun = os.path.join(args.bin_dir, "fleetrun")
    if not os.access(fleetrun, os.X_OK):
        print(f"{fleetrun} is missing: build it first (bench/gpu-check.sh does)")
        return 1

    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "gpu_score.py"), "w") as f:
        f.write(SCORE_SCRIPT)
    print(f"== {args.images} images of 3x224x224 (float16) in {work}/images, mini-batches of {args.batch}, {gpus} GPU(s)")
    files = write_images(os.path.join(work, "images"), args.images)

    print("== plain PyTorch loop (one process, one GPU)")
    loop_rate, loop_rows = plain_loop(work, files, args.batch)
    print(f"   {loop_rate:,.0f} images/s")

    print("== fleetrun run (one runner per GPU)")
    output = tempfile.mkdtemp(prefix="out-", dir=work)
    job = os.path.join(work, "job.toml")
    with open(job, "w") as f:
        # The runners use this interpreter's virtualenv, where PyTorch is.
        venv = f'environment = "{sys.prefix}"\n' if sys.prefix != sys.base_prefix else ""
        f.write(JOB.format(batch=args.batch, gpus=gpus, environment=venv, images=os.path.join(work, "images"), output=output))
    with Nvml() as nvml:
        started = time.perf_counter()
        ran = subprocess.run([fleetrun, "run", job, "--quiet"], cwd=work)
        elapsed = time.perf_counter() - started
    if ran.returncode != 0:
        print(f"fleetrun run failed (exit {ran.returncode}); its logs are in {output}/logs")
        return 1
    fleet_rate = args.images / elapsed
    print(f"   {fleet_rate:,.0f} images/s, wall time including the runners' start and CUDA's init")
    print(f"== fleetrun / plain loop: {fleet_rate / loop_rate:.2f}x on {gpus} GPU(s)")

    result = os.path.join(output, "logs", "job_result.txt")
    split = [line for line in open(result) if line.startswith("GPU busy")] if os.path.exists(result) else []
    print("== where the GPU time went: " + (split[0].strip() if split else "this build writes no GPU-busy split"))
    print("== NVML while fleetrun ran")
    for line in nvml.summary():
        print("   " + line)

    with open(os.path.join(output, "scores.txt")) as f:
        fleet_rows = sorted(line.rstrip("\n") for line in f)
    if fleet_rows != sorted(loop_rows):
        print(f"the outputs differ: fleetrun wrote {len(fleet_rows)} rows, the loop {len(loop_rows)}")
        return 1
    print(f"== both sides wrote the same {len(fleet_rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
