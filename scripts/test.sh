#!/usr/bin/env bash
# Every test tier, the way CI runs it: formatting, lints, then unit, flow, end-to-end and
# real-server tests (RabbitMQ, Redis and an S3 server installed when missing by
# scripts/install-deps.sh and started on loopback by scripts/services.sh), run by
# cargo-nextest (installed by the same script), a short chaos run among them, and a short
# run of each fuzz target (scripts/fuzz.sh).
#
#   scripts/test.sh                 # everything
#   FLEETRUN_KEEP_SERVICES=1 scripts/test.sh   # leave the servers running afterwards
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '\n== %s\n' "$*" >&2; }

scripts/install-deps.sh
scripts/services.sh start
if [ -z "${FLEETRUN_KEEP_SERVICES:-}" ]; then
  trap 'scripts/services.sh stop' EXIT
fi
# A developer's own fleetrun settings (FLEETRUN_GPU_COUNT, FLEETRUN_POOL, AWS_PROFILE, ...)
# reach no test: only the servers' addresses below do. The fixtures that start the
# binaries clear them too, for a plain `cargo test`.
for name in $(compgen -e); do
  case $name in
    FLEETRUN_KEEP_SERVICES | FLEETRUN_SERVICES_DIR) ;;
    FLEETRUN_* | AWS_* | CHAOS_*) unset "$name" ;;
  esac
done
eval "$(scripts/services.sh env)"

say "cargo fmt --check"
cargo fmt --all -- --check

say "deployment files"
scripts/check-deploy.sh

say "module graph: no import cycle in worker/src/agent and worker/src/job"
python3 scripts/module-graph.py --check worker/src/agent worker/src/job >/dev/null

say "cargo clippy"
cargo clippy --workspace --all-targets --features fleetrun-tests/services -- -D warnings

# The end-to-end tests run the built binaries (fleetrun, fleetrun-runner).
say "cargo build"
cargo build --workspace

# The `fleetrun` wheel of that build, which tests/tests/python_package.rs installs into fresh
# virtualenvs (the tests do not build it: maturin runs cargo).
say "the Python wheel"
scripts/build-wheel.sh --debug --out target/debug/python-wheel >/dev/null

# A broker under a resource alarm (its disk nearly full, say: the build takes gigabytes)
# blocks every publish, and each test would wait it out to its time limit: say so and stop.
say "RabbitMQ's alarms"
if ! rabbitmq-diagnostics -q -n fleetrun@localhost check_local_alarms >&2; then
  df -h . /var/lib/rabbitmq >&2
  echo "RabbitMQ blocks publishing under the resource alarm above: free disk or memory, then run again" >&2
  exit 1
fi

# nextest (installed by scripts/install-deps.sh) kills a test that outlives its limit. The
# chaos run's short form (two trials, tests/tests/fleet/chaos.rs) is among the tests.
say "tests"
cargo nextest run --workspace --features fleetrun-tests/services --no-fail-fast

# Each fuzz target for 25 s from its seed corpus (installs cargo-fuzz when missing).
say "fuzzing"
scripts/fuzz.sh
