"""Benchmark entry script: the least work a run() can do with a file.

run() reads each file fully and returns one line per file: "<basename> <length>".
Used both by fleetrun (job-trivial.toml) and by pool_baseline.py, so the work is
identical and the difference is the framework's overhead.
"""

import os


def run(mini_batch):
    rows = []
    for path in mini_batch:
        with open(path, "rb") as f:
            size = len(f.read())
        rows.append(f"{os.path.basename(path)} {size}")
    return rows
