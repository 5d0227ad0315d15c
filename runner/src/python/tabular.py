"""fleetrun's reader of a tabular input's staged chunks.

The runner executes this file as the module ``fleetrun_tabular``. ``check`` runs once, before
the entry script loads: a job whose environment lacks pandas (or pyarrow, for Parquet) fails
there with the package named, before any mini-batch. ``read`` turns a mini-batch's staged
chunks (CSV with its header, JSON Lines, or a sparse Parquet copy holding the chunk's row
groups and the footer) into the one DataFrame ``run()`` receives.
"""

import os


class MissingPackage(Exception):
    """A package a tabular input needs is not importable in the job's environment."""


def check(parquet):
    needed = [("pandas", "pandas")]
    if parquet:
        needed.append(("pyarrow", "pyarrow"))
    import sys

    for module, package in needed:
        try:
            __import__(module)
        except ImportError as e:
            raise MissingPackage(
                "a tabular input needs %s, which the job's Python (%s) cannot import (%s); "
                "install it there: %s -m pip install %s"
                % (package, sys.executable, e, sys.executable, package)
            ) from None


def read(tables, separator):
    """``tables``: (path, format, row_groups) of each staged chunk, in order."""
    import pandas as pd

    frames = []
    for path, fmt, row_groups in tables:
        if fmt == "Csv":
            frames.append(pd.read_csv(path, sep=separator))
        elif fmt == "JsonLines":
            if os.path.getsize(path) == 0:
                frames.append(pd.DataFrame())
            else:
                frames.append(pd.read_json(path, lines=True))
        else:
            import pyarrow.parquet as pq

            with pq.ParquetFile(path) as f:
                frames.append(f.read_row_groups(list(row_groups)).to_pandas())
    if len(frames) == 1:
        return frames[0]
    return pd.concat(frames, ignore_index=True)
