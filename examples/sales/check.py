"""Check the sales example's output: every sale once, each store's shares summing to 1.

usage: python check.py INPUT_CSV OUTPUT_CSV
"""

import sys

import pandas as pd


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    sales = pd.read_csv(argv[1])
    shares = pd.read_csv(argv[2], sep=" ", header=None, names=["order_id", "store", "share"])
    missing = set(sales.order_id) - set(shares.order_id)
    repeated = int(shares.order_id.duplicated().sum())
    sums = shares.groupby("store").share.sum()
    off = sums[(sums - 1).abs() > 1e-3]
    print(f"check: {len(shares)} rows for {len(sales)} sales, {len(missing)} missing, "
          f"{repeated} repeated, {len(sums)} stores, {len(off)} whose shares do not sum to 1")
    return 0 if not missing and not repeated and off.empty else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
