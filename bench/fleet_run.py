"""The distributed side of a benchmark row: one `fleetrun-worker` with 2 runner processes
on the pool `bench`, and `fleetrun submit JOB --wait` through RabbitMQ + Redis (local storage).

    python3 bench/fleet_run.py JOB.toml

Connection settings: FLEETRUN_AMQP_URL / FLEETRUN_REDIS_URL, else the loopback servers
of scripts/services.sh. Exits with submit's exit code.
"""
import os
import subprocess
import sys

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


def main(job: str) -> int:
    env = fleet_env()
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
    sys.exit(main(sys.argv[1]))
