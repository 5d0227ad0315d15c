"""Writes the seed corpus of the wire and protocol targets: messages and frames as fleetrun
encodes them (rmp-serde's named maps, enums externally tagged, paths as binaries).

    python3 fuzz/seeds.py        # rewrites fuzz/corpus/{wire,protocol}/seed-*
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def pack(v):
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if 0 <= v < 2**32:
            return b"\xce" + struct.pack(">I", v)
        return b"\xcf" + struct.pack(">Q", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        b = v.encode()
        return (bytes([0xA0 | len(b)]) if len(b) < 32 else b"\xd9" + bytes([len(b)])) + b
    if isinstance(v, bytes):
        return b"\xc4" + bytes([len(v)]) + v
    if isinstance(v, list):
        return bytes([0x90 | len(v)]) + b"".join(pack(x) for x in v)
    if isinstance(v, dict):
        return bytes([0x80 | len(v)]) + b"".join(pack(k) + pack(x) for k, x in v.items())
    raise TypeError(v)


def frame(v):
    body = pack(v)
    return struct.pack(">I", len(body)) + body


def write(target, name, data):
    with open(os.path.join(HERE, "corpus", target, "seed-" + name), "wb") as f:
        f.write(data)


chunk = {"key": "data/a.csv", "format": "Csv", "size": 100, "ranges": [[10, 60], [60, 100]],
         "header": b"id,region\n", "rows": 4, "first_row": 0}
parquet = {"key": "p/rows.parquet", "format": "Parquet", "size": 4000,
           "ranges": [[4, 900], [3900, 4000]], "row_groups": [0, 3]}
write("wire", "files", pack({"v": 1, "job": "digits-1", "index": 7,
                             "items": ["g00/f0001.txt", "g00/f0002.txt"]}))
write("wire", "partitioned", pack({"v": 1, "job": "sales-2", "index": 0, "items": ["u1/a.txt"],
                                   "partition": {"user": "u1", "Store": "1000"}}))
write("wire", "tabular", pack({"v": 2, "job": "tab-3", "index": 2, "items": [],
                               "chunks": [chunk, parquet]}))
write("wire", "version-9", pack({"v": 9, "job": "x", "index": 0, "items": []}))

init = {"entry_script": "/job/code/score.py", "source_directory": "/job/code",
        "arguments": ["--labels", "/cache/labels.txt"], "node_id": "w1",
        "process_name": "process000", "log_dir": "/out/logs", "output_dir": "/out",
        "logging_level": "INFO", "environment": None,
        "tabular": {"separator": 44, "parquet": False}, "append_row_separator": 32,
        "working_dir": "/scratch/process000", "models": {"digits": "/cache/digits"},
        "profile": None}
run = {"mini_batch": 3, "items": [b"/stage/a.png", b"/stage/\xff.png"],
       "context": {"partition_key_value": {"Store": "1000"}, "dataset": "s3://b/in"},
       "tables": [{"path": "/stage/c0.csv", "format": "Csv", "row_groups": []}]}
timing = {"run_seconds": 0.25, "cpu_seconds": 0.2}
write("protocol", "requests", b"\x00" + frame({"Init": init}) + frame({"Run": run})
      + frame("Shutdown"))
write("protocol", "replies", b"\x01" + frame({"Ready": {
    "python_version": "3.11.9", "python_prefix": "/usr", "python_executable": "/usr/bin/python3",
    "pid": 4242}}) + frame({"Done": {"rows": ["a 1", "b 2"], "timing": timing, "given": 2,
                                      "header": "id label"}})
      + frame({"Failed": {"error": {"message": "ValueError: no", "traceback": "Traceback"},
                          "timing": timing}}))
write("protocol", "init-failed", b"\x01" + frame({"InitFailed": {
    "message": "ImportError: no model", "traceback": "Traceback (most recent call last)"}}))
