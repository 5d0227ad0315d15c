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


class UnknownColumn(Exception):
    """An MLTable's ``drop_columns`` names a column the mini-batch's rows do not have."""


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


def read(tables, options):
    """``tables``: (path, format, row_groups, columns) of each staged chunk, in order, where
    ``columns`` are (name, value) pairs every row of the chunk gets (an MLTable's columns
    from the path, as strings). ``options``: (separator, encoding, empty_as_string,
    drop_columns), the last the files' columns an MLTable's ``drop_columns`` takes out."""
    import pandas as pd

    separator, encoding, empty_as_string, drop_columns = options
    csv_options = {"sep": separator}
    if encoding:
        csv_options["encoding"] = encoding
    if empty_as_string:
        # An empty field is "", pandas' other missing-value markers stay missing.
        from pandas._libs.parsers import STR_NA_VALUES

        csv_options["keep_default_na"] = False
        csv_options["na_values"] = sorted(STR_NA_VALUES - {""})
    frames = []
    for path, fmt, row_groups, columns in tables:
        if fmt == "Csv":
            frame = pd.read_csv(path, **csv_options)
        elif fmt == "JsonLines":
            if os.path.getsize(path) == 0:
                frame = pd.DataFrame()
            else:
                frame = pd.read_json(path, lines=True, encoding=encoding or "utf-8")
        else:
            import pyarrow.parquet as pq

            with pq.ParquetFile(path) as f:
                frame = f.read_row_groups(list(row_groups)).to_pandas()
        for name, value in columns:
            frame[name] = value
        frames.append(frame)
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    if drop_columns and len(frame.columns) > 0:
        missing = [name for name in drop_columns if name not in frame.columns]
        if missing:
            raise UnknownColumn(
                "the MLTable's drop_columns names %s, which is neither a column of this "
                "mini-batch's rows (%s) nor one it takes from the path"
                % (", ".join(missing), ", ".join(map(str, frame.columns)))
            )
        frame = frame.drop(columns=drop_columns)
    return frame
