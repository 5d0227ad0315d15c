"""The distributed side of a benchmark row: one `fleetrun-worker` with 2 runner processes
on the pool `bench`, and `fleetrun submit JOB --wait` through RabbitMQ + Redis (local storage).

    python3 bench/fleet_run.py [--replica] JOB.toml

With --replica, a replica of the ledger's Redis runs for the job (started here, on a free
port, and synced before the job): the ledger then waits for it on every recording.

Connection settings: FLEETRUN_AMQP_URL / FLEETRUN_REDIS_URL, else the loopback servers
of scripts/services.sh. Exits with submit's exit code.
"""
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
# The binaries bench/measure.py measures (its --bin-dir), else the release build's.
RELEASE = os.environ.get("BENCH_BIN_DIR") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR") or os.path.join(os.path.dirname(BENCH), "target"),
    "release")


def fleet_env() -> dict:
    env = dict(os.environ)
    env.setdefault("FLEETRUN_AMQP_URL",
                   env.get("FLEETRUN_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5673/%2f"))
    env.setdefault("FLEETRUN_REDIS_URL",
                   env.get("FLEETRUN_TEST_REDIS_URL", "redis://127.0.0.1:6390/"))
    # One pool for every run: each pool is a quorum queue the broker keeps up.
    env["FLEETRUN_POOL"] = "bench"
    env.pop("VIRTUAL_ENV", None)
    return env


@contextlib.contextmanager
def replica_of(url: str):
    """A replica of the Redis at `url` (redis://host:port/), synced, for the block's length."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        own = s.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="bench-replica-")
    server = subprocess.Popen(
        ["redis-server", "--port", str(own), "--bind", "127.0.0.1", "--replicaof", host, port,
         "--save", "", "--appendonly", "no", "--dir", folder],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while b"master_link_status:up" not in subprocess.run(
                ["redis-cli", "-p", str(own), "INFO", "replication"],
                capture_output=True).stdout:
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"the replica of {host}:{port} did not sync")
            time.sleep(0.1)
        yield
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def main(job: str, replica: bool) -> int:
    env = fleet_env()
    with replica_of(env["FLEETRUN_REDIS_URL"]) if replica else contextlib.nullcontext():
        return submit(job, env)


def submit(job: str, env: dict) -> int:
    worker = subprocess.Popen(
        [os.path.join(RELEASE, "fleetrun-worker"), "--processes", "2", "--node-id", "bench"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        return subprocess.call(
            [os.path.join(RELEASE, "fleetrun"), "submit", job, "--wait", "--quiet", "--create-pool"], env=env)
    finally:
        worker.terminate()
        worker.wait()


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[-1], "--replica" in args[:-1]))
