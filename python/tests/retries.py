"""fleetrun.Client against a server that drops every connection: a read and a submission
under its own id are tried again (1 + retries times), a submission without an id and a
cancel once; each ends in Unavailable. Also: a TOML job file is read with its relative paths
made absolute from its folder. Prints "ok".

    python retries.py WORK_DIR
"""

import os
import socket
import sys
import threading

import fleetrun

work = sys.argv[1]

listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
accepted = []


def drop_all():
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        accepted.append(1)
        conn.recv(65536)
        conn.close()  # no answer: the client sees the connection dropped


threading.Thread(target=drop_all, daemon=True).start()
client = fleetrun.Client(f"http://127.0.0.1:{listener.getsockname()[1]}", token="t", retries=2)
job = {"name": "py-retry", "entry_script": "/nonexistent/score.py"}


def attempts(call):
    before = len(accepted)
    try:
        call()
        raise AssertionError("a dropped connection was an answer")
    except fleetrun.Unavailable as e:
        assert e.status == 0, e
    return len(accepted) - before


assert attempts(client.jobs) == 3
assert attempts(lambda: client.status("j1")) == 3
assert attempts(lambda: client.submit(job, job_id="py-retry-1")) == 3
assert attempts(lambda: client.submit(job)) == 1
assert attempts(lambda: client.cancel("j1")) == 1
listener.close()

# A job file's relative paths, from its folder, whatever the current one.
folder = os.path.join(work, "project")
os.makedirs(folder)
with open(os.path.join(folder, "job.toml"), "w") as f:
    f.write(
        'name = "py-paths"\nentry_script = "score.py"\nenvironment = ".venv"\n'
        'output_action = "append_row"\n[input]\nfiles = "data"\n'
        '[output]\npath = "s3://bucket/out"\n[side_inputs]\nlabels = "ref/labels.txt"\n'
    )
os.chdir("/")
if sys.version_info >= (3, 11):
    from fleetrun._jobfile import load_job

    loaded = load_job(os.path.join(folder, "job.toml"))
    real = os.path.realpath(folder)
    assert loaded["entry_script"] == os.path.join(real, "score.py"), loaded
    assert loaded["environment"] == os.path.join(real, ".venv"), loaded
    assert loaded["input"] == {"files": os.path.join(real, "data")}, loaded
    assert loaded["output"] == {"path": "s3://bucket/out"}, loaded
    assert loaded["side_inputs"] == {"labels": os.path.join(real, "ref/labels.txt")}, loaded
else:
    try:
        client.submit(os.path.join(folder, "job.toml"))
        raise AssertionError("a TOML file was read without tomllib")
    except fleetrun.FleetrunError as e:
        assert "tomli" in str(e), e
print("ok")
