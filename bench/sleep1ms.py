"""Benchmark entry script: trivial.py plus 1 ms of "work" (a sleep) per file.

A sleep costs no CPU, so this case shows how well the framework keeps 2 processes
busy when run() itself is not free (20,000 files x 1 ms / 2 processes = 10 s ideal).
"""

import os
import time


def run(mini_batch):
    rows = []
    for path in mini_batch:
        with open(path, "rb") as f:
            size = len(f.read())
        time.sleep(0.001)
        rows.append(f"{os.path.basename(path)} {size}")
    return rows
