"""Write data/sales.csv: 20,000 sales of 8 stores, a few with a newline in their note.

usage: python make_data.py
"""

import csv
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
STORES = ["amsterdam", "berlin", "lisbon", "madrid", "oslo", "paris", "rome", "vienna"]


def main():
    rng = random.Random(7)
    os.makedirs(os.path.join(HERE, "data"), exist_ok=True)
    path = os.path.join(HERE, "data", "sales.csv")
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["order_id", "store", "amount", "note"])
        for order in range(20_000):
            note = "gift, wrapped\nleave at the door" if order % 997 == 0 else ""
            out.writerow([order, rng.choice(STORES), f"{rng.uniform(1, 500):.2f}", note])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
