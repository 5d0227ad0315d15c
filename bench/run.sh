#!/usr/bin/env bash
# The benchmark: fleetrun vs a plain multiprocessing.Pool(2) and vs one plain Python loop,
# on the same files and the same entry scripts (trivial.py, sleep1ms.py). Not a test;
# numbers depend on the machine.
#
#   bench/run.sh            20,000 files of 1 KB in folders of 1,000, and 300,000 in one
#                           folder, 3 repetitions per case (medians)
#   bench/run.sh --quick    2,000 and 3,000 files, 1 repetition (CI: the bench still runs)
#
# Other options go to bench/measure.py (--files N, --flat-files N, --reps K, --cases
# trivial, --pool-only, --bin-dir DIR). The binaries measured are the release build's:
# $CARGO_TARGET_DIR/release when that is set, else target/release.
# Input and outputs live in bench/work/ (gitignored); results in bench/work/results.json,
# each run's console output in bench/work/logs/. PYTHON picks the interpreter for the
# Pool baseline (default python3; use the Python the jobs run, the same python3 by default).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd "$HERE/.." && pwd -P)"
PYTHON="${PYTHON:-python3}"

echo "== building fleetrun (cargo build --release)"
(cd "$ROOT" && cargo build --release)

echo "== starting RabbitMQ and Redis for the distributed rows (scripts/services.sh)"
"$ROOT/scripts/services.sh" start

echo "== measuring"
exec "$PYTHON" "$HERE/measure.py" "$@"
