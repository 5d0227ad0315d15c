"""The baseline fleetrun is measured against: plain multiprocessing.Pool.

    python3 bench/pool_baseline.py --script bench/trivial.py --data bench/work/data \
        --out bench/work/out-trivial-pool/parallel_run_step.txt

Lists the input files recursively in sorted order, cuts them into mini-batches of 10,
and feeds them to Pool(2).imap (one mini-batch per task, like fleetrun); each worker
imports the SAME entry script (calling its init() once if it has one) and calls its
run(). Every returned line goes to one output file. Prints items/s, and one JSON line
(prefixed "RESULT ") for bench/measure.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import sys
import time

_run = None


def _load_script(path: str) -> None:
    """Pool initializer: import the entry script once per worker process."""
    global _run
    path = os.path.abspath(path)
    sys.path.insert(0, os.path.dirname(path))  # like fleetrun: siblings importable
    spec = importlib.util.spec_from_file_location("entry_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "init"):
        module.init()
    _run = module.run


def _chunk_fn(mini_batch: list[str]) -> tuple[int, list]:
    return len(mini_batch), list(_run(mini_batch))


def list_files(root: str) -> list[str]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        files.extend(os.path.join(dirpath, name) for name in filenames)
    files.sort()
    return files


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="multiprocessing.Pool baseline")
    parser.add_argument("--script", required=True, help="entry script with run(mini_batch)")
    parser.add_argument("--data", required=True, help="input folder (read recursively)")
    parser.add_argument("--out", required=True, help="output file (one line per returned element)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--mini-batch-size", type=int, default=10)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    files = list_files(args.data)
    n = args.mini_batch_size
    chunks = [files[i:i + n] for i in range(0, len(files), n)]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    rows = failed = 0
    with open(args.out, "w", encoding="utf-8") as out, \
            multiprocessing.Pool(args.processes, initializer=_load_script,
                                 initargs=(args.script,)) as pool:
        for given, returned in pool.imap(_chunk_fn, chunks):
            for element in returned:
                out.write(f"{element}\n")
            rows += len(returned)
            failed += max(0, given - len(returned))
    wall = time.perf_counter() - start

    result = {
        "items": len(files), "mini_batches": len(chunks), "rows": rows,
        "failed": failed, "wall_s": wall, "items_per_s": len(files) / wall if wall else 0.0,
    }
    print(f"pool: {len(files)} items, {len(chunks)} mini-batches, {rows} rows in "
          f"{wall:.2f} s = {result['items_per_s']:.0f} items/s")
    print("RESULT " + json.dumps(result))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
