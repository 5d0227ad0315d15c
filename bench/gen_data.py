"""Benchmark input: N files of 1 KB under bench/work/data/, 1,000 per subfolder, or with
--flat all in the one folder bench/work/data-flat/.

    python3 bench/gen_data.py [--files 20000] [--data DIR] [--flat]

Deterministic (seeded): file f-NNNNNN.txt in d-MM/ holds 1,024 base64 characters.
File names are unique over the whole tree, so output lines can be compared as a set.
An existing tree is reused when its stamp and its file count say it has N files;
otherwise it is rebuilt from scratch.
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "work", "data")
FLAT_DATA = os.path.join(HERE, "work", "data-flat")
LARGE_DATA = os.path.join(HERE, "work", "data-large")
FILE_SIZE = 1024
PER_FOLDER = 1000
SEED = 20240611
FORMAT = "v1"  # bump when the content changes, so old trees are rebuilt


def stamp_path(data_dir: str) -> str:
    # Beside the tree, never inside it (it would be an input file).
    return data_dir.rstrip(os.sep) + ".stamp"


def count_files(data_dir: str) -> int:
    return sum(len(files) for _, _, files in os.walk(data_dir))


def ensure_data(n_files: int, data_dir: str = DEFAULT_DATA, quiet: bool = False,
                flat: bool = False) -> str:
    """Make sure data_dir holds exactly the n_files benchmark files (all in data_dir itself
    when flat); return data_dir."""
    per_folder = max(n_files, 1) if flat else PER_FOLDER
    want = f"{FORMAT} {n_files} {FILE_SIZE} {'flat' if flat else PER_FOLDER} {SEED}"
    stamp = stamp_path(data_dir)
    if os.path.isdir(data_dir) and os.path.isfile(stamp):
        with open(stamp, encoding="utf-8") as f:
            have = f.read().strip()
        if have == want and count_files(data_dir) == n_files:
            if not quiet:
                print(f"data: reusing {n_files} files in {data_dir}")
            return data_dir

    start = time.perf_counter()
    if os.path.exists(stamp):
        os.remove(stamp)
    if os.path.isdir(data_dir):
        shutil.rmtree(data_dir)
    rng = random.Random(SEED)
    raw = FILE_SIZE * 3 // 4  # base64 of 768 bytes is exactly 1,024 characters
    for i in range(n_files):
        folder = data_dir if flat else os.path.join(data_dir, f"d-{i // per_folder:02d}")
        if i % per_folder == 0:
            os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"f-{i:06d}.txt"), "wb") as f:
            f.write(base64.b64encode(rng.randbytes(raw)))
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(want + "\n")
    if not quiet:
        print(f"data: wrote {n_files} files of {FILE_SIZE} B in {data_dir} "
              f"({time.perf_counter() - start:.1f} s)")
    return data_dir


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--data")
    parser.add_argument("--flat", action="store_true", help="every file in one folder")
    args = parser.parse_args(argv)
    data = args.data or (FLAT_DATA if args.flat else DEFAULT_DATA)
    ensure_data(args.files, data, flat=args.flat)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
