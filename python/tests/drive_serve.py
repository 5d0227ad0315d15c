"""Drives `fleetrun serve` through fleetrun.Client, as a Python service would, and receives
the jobs' webhooks, checking them with fleetrun.verify_webhook.

    python drive_serve.py BASE_URL WORK_DIR

The token is in $API_TOKEN and the webhooks' secret in $WEBHOOK_SECRET (never printed).
WORK_DIR holds fast.py and slow.py (entry scripts) and in/ (20 input files); outputs go
to WORK_DIR/out-*. Prints "ok" at the end; any failed check raises.
"""

import http.server
import json
import os
import sys
import threading
import time

import fleetrun

base, work = sys.argv[1], sys.argv[2]
token, secret = os.environ["API_TOKEN"], os.environ["WEBHOOK_SECRET"]
suffix = str(os.getpid())

# --- a webhook receiver -------------------------------------------------------------------
received = []  # (body, headers, verified)


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        ok = fleetrun.verify_webhook(body, self.headers, secret)
        received.append((body, self.headers, ok))
        self.send_response(204 if ok else 401)
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
threading.Thread(target=server.serve_forever, daemon=True).start()
notify_url = f"http://127.0.0.1:{server.server_address[1]}/hook"


def job(name, script, out):
    return {
        "name": f"{name}-{suffix}",
        "entry_script": os.path.join(work, script),
        "output_action": "append_row",
        "mini_batch_size": 2,
        "input": {"files": os.path.join(work, "in")},
        "output": {"path": os.path.join(work, out)},
        "notify_url": notify_url,
    }


client = fleetrun.Client(base, token=token)
assert token not in repr(client), "the token is never shown"

# --- submit with an id of our own; again attaches -----------------------------------------
first_id = f"py-first-{suffix}"
first = client.submit(job("py-fast", "fast.py", "out-fast"), job_id=first_id)
assert first.id == first_id and not first.attached, first
again = client.submit(job("py-fast", "fast.py", "out-fast"), job_id=first_id)
assert again.id == first_id and again.attached, again

# The same id with another job is a conflict.
try:
    client.submit(dict(job("py-fast", "fast.py", "out-fast"), mini_batch_size=7), job_id=first_id)
    raise AssertionError("a conflicting submission was taken")
except fleetrun.Conflict as e:
    assert e.status == 409, e

status = first.wait(timeout=120, poll=0.5)
assert status.state == fleetrun.JobState.COMPLETED, status
assert status.completed and status.ended and status.cause is None, status
assert status.counts.succeeded_items == 20 and status.counts.failed_items == 0, status.counts
assert status.counts.total_mini_batches == 10, status.counts
assert status.output.endswith("out-fast/parallel_run_step.txt"), status.output
with open(status.output) as f:
    assert sorted(f.read().split()) == [f"f{i:02d}" for i in range(20)]
assert first_id in [j.job_id for j in client.jobs()]
assert client.job(first_id).status().state == fleetrun.JobState.COMPLETED

# --- a bad job: BadJob with the one-line message ------------------------------------------
bad = job("py-bad", "fast.py", "out-bad")
bad["mini_batch_size"] = 0
try:
    client.submit(bad, job_id=f"py-bad-{suffix}")
    raise AssertionError("a bad job was taken")
except fleetrun.BadJob as e:
    assert e.status == 422, e.status
    assert "mini_batch_size" in str(e) and "\n" not in str(e), str(e)

# --- an unknown id -------------------------------------------------------------------------
try:
    client.job(f"no-such-job-{suffix}")
    raise AssertionError("an unknown job was found")
except fleetrun.NotFound as e:
    assert e.status == 404 and f"no-such-job-{suffix}" in str(e), e

# --- a wrong token ------------------------------------------------------------------------
try:
    fleetrun.Client(base, token="wrong").jobs()
    raise AssertionError("a wrong token was let in")
except fleetrun.Unauthorized as e:
    assert "wrong" not in str(e), e

# --- cancel ---------------------------------------------------------------------------------
slow = client.submit(job("py-slow", "slow.py", "out-slow"))
assert not slow.attached and slow.id.startswith(f"py-slow-{suffix}"), slow
after = slow.cancel()
assert after.job_id == slow.id, after
ended = slow.wait(timeout=60, poll=0.5, raise_on_failure=False)
assert ended.state == fleetrun.JobState.CANCELED, ended
assert ended.counts.succeeded_items < 20, ended.counts
try:
    slow.wait(timeout=10)
    raise AssertionError("wait() on a canceled job returned")
except fleetrun.JobEnded as e:
    assert e.status.state == fleetrun.JobState.CANCELED and "Canceled" in str(e), e

# --- a deadline: wait() raises JobEnded with EXPIRED -----------------------------------------
late = client.submit(dict(job("py-late", "slow.py", "out-late"), deadline="4s"))
try:
    late.wait(timeout=90, poll=0.5)
    raise AssertionError("wait() on an expired job returned")
except fleetrun.JobEnded as e:
    assert e.status.state == fleetrun.JobState.EXPIRED and "Expired" in str(e), e
    assert e.status.ended and not e.status.completed, e.status
    assert e.status.counts.succeeded_items < 20, e.status.counts

# --- the webhooks -------------------------------------------------------------------------
deadline = time.monotonic() + 60
while time.monotonic() < deadline and {json.loads(b)["job_id"] for b, _, _ in received} < {
    first_id,
    slow.id,
    late.id,
}:
    time.sleep(0.2)
events = {json.loads(b)["job_id"]: (b, h, ok) for b, h, ok in received}
assert first_id in events and slow.id in events, [json.loads(b) for b, _, _ in received]
body, headers, ok = events[first_id]
assert ok, "the completed job's webhook verifies"
assert json.loads(body)["state"] == "Completed", body
assert headers.get(fleetrun.EVENT_HEADER) == "job.completed", headers
assert events[slow.id][2], "the canceled job's webhook verifies"
late_body, late_headers, late_ok = events[late.id]
assert late_ok and json.loads(late_body)["state"] == "Expired", late_body
assert late_headers.get(fleetrun.EVENT_HEADER) == "job.expired", late_headers
assert not fleetrun.verify_webhook(body.replace(b"Completed", b"Failed"), headers, secret)
assert not fleetrun.verify_webhook(body, headers, "another secret")
assert not fleetrun.verify_webhook(body, {}, secret)
server.shutdown()
print("ok")
