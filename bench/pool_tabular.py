"""The tabular baseline: pandas read_csv(chunksize=...) chunks in multiprocessing.Pool.

    python3 bench/pool_tabular.py --script bench/sleep_rows.py --data bench/work/tabular/rows.csv \
        --out bench/work/out-tabular-pool/parallel_run_step.txt --chunk-bytes 262144

The main process parses the CSV with pandas in chunks of about --chunk-bytes of text
(rows per chunk = chunk bytes / the file's mean row length, so the chunks match
fleetrun's mini_batch_size) and feeds each DataFrame to Pool(2).imap; each worker
imports the SAME entry script and calls its run(). Every returned element goes to one
output file. Prints items/s (rows) and one JSON line (prefixed "RESULT ").
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time

import pandas as pd

from pool_baseline import _load_script
import pool_baseline


def _chunk_fn(frame) -> tuple[int, list]:
    return len(frame), list(pool_baseline._run(frame))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="pandas + multiprocessing.Pool baseline")
    parser.add_argument("--script", required=True)
    parser.add_argument("--data", required=True, help="the CSV file")
    parser.add_argument("--out", required=True)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--chunk-bytes", type=int, default=1 << 20)
    parser.add_argument("--rows", type=int, required=True, help="rows in the file")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    mean_row = os.path.getsize(args.data) / max(args.rows, 1)
    chunksize = max(1, int(args.chunk_bytes / mean_row))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    rows = failed = chunks = 0
    with open(args.out, "w", encoding="utf-8") as out, \
            multiprocessing.Pool(args.processes, initializer=_load_script,
                                 initargs=(args.script,)) as pool:
        reader = pd.read_csv(args.data, chunksize=chunksize)
        for given, returned in pool.imap(_chunk_fn, reader):
            chunks += 1
            for element in returned:
                out.write(f"{element}\n")
            rows += len(returned)
            failed += max(0, given - len(returned))
    wall = time.perf_counter() - start
    result = {"items": args.rows, "mini_batches": chunks, "rows": rows, "failed": failed,
              "wall_s": wall, "items_per_s": args.rows / wall if wall else 0.0}
    print(f"pool: {args.rows} rows, {chunks} chunks of {chunksize} rows in {wall:.2f} s = "
          f"{result['items_per_s']:.0f} rows/s")
    print("RESULT " + json.dumps(result))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
