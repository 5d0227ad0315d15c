"""Benchmark input for the tabular row: one CSV under bench/work/tabular/rows.csv.

    python3 bench/gen_csv.py [--rows 1000000]

Deterministic: row i is `i,name-<i mod 997>,<value>` with a header `id,name,value`; every
1,000th name holds a quoted comma and newline, so chunk edges meet RFC 4180 quoting.
Reused when its stamp says it has the rows asked for.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CSV = os.path.join(HERE, "work", "tabular", "rows.csv")
FORMAT = "v1"


def ensure_csv(rows: int, path: str = DEFAULT_CSV, quiet: bool = False) -> str:
    want = f"{FORMAT} {rows}"
    stamp = path + ".stamp"
    if os.path.isfile(path) and os.path.isfile(stamp):
        with open(stamp, encoding="utf-8") as f:
            if f.read().strip() == want:
                if not quiet:
                    print(f"data: reusing {rows} rows in {path}")
                return path
    start = time.perf_counter()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("id,name,value\n")
        for i in range(rows):
            name = f'"name {i}, with\nnewline"' if i % 1000 == 0 else f"name-{i % 997}"
            f.write(f"{i},{name},{(i * 7919) % 100003}\n")
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(want + "\n")
    if not quiet:
        print(f"data: wrote {rows} rows in {path} ({time.perf_counter() - start:.1f} s)")
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    ensure_csv(args.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
