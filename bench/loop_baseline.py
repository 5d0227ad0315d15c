"""The simplest baseline: one plain Python loop, no parallelism at all.

    python3 bench/loop_baseline.py --script bench/trivial.py --data bench/work/data \
        --out bench/work/out-trivial-loop/parallel_run_step.txt

Lists the input files as pool_baseline.py does (recursively, sorted), cuts mini-batches
of 10, and calls the entry script's run() on each in this one process (after its init(),
if it has one), writing every returned line to one output file. What fleetrun's two
runners must beat to be worth running on two cores. Prints one JSON line (prefixed
"RESULT ").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import pool_baseline


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="one plain Python loop")
    parser.add_argument("--script", required=True, help="entry script with run(mini_batch)")
    parser.add_argument("--data", required=True, help="input folder (read recursively)")
    parser.add_argument("--out", required=True, help="output file (one line per returned element)")
    parser.add_argument("--mini-batch-size", type=int, default=10)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    pool_baseline._load_script(args.script)  # imports it, calls its init()
    run = pool_baseline._run
    files = pool_baseline.list_files(args.data)
    n = args.mini_batch_size
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    rows = failed = 0
    with open(args.out, "w", encoding="utf-8") as out:
        for i in range(0, len(files), n):
            mini_batch = files[i:i + n]
            returned = list(run(mini_batch))
            for element in returned:
                out.write(f"{element}\n")
            rows += len(returned)
            failed += max(0, len(mini_batch) - len(returned))
    wall = time.perf_counter() - start
    print("RESULT " + json.dumps({"items": len(files), "rows": rows, "failed": failed,
                                  "wall_s": wall}))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
