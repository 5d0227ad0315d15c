#!/usr/bin/env bash
# The tabular example, in one command (from any folder):
#
#   examples/sales/run.sh [--set key=value ...]
#
# Creates .venv with pandas, writes data/sales.csv (20,000 sales of 8 stores), builds
# fleetrun and runs job.toml: one mini-batch per store (partition_keys = ["store"]), each
# sale's share of its store's revenue appended to out/shares.csv. Exits with fleetrun's
# exit code.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"

example_venv
say "generating the input"
"$VENV/bin/python" "$HERE/make_data.py"
example_build
rm -rf "$HERE/out"
example_run "$HERE/job.toml" "$@"
if [[ -f "$HERE/out/shares.csv" ]]; then
    say "output: $HERE/out/shares.csv, first lines:"
    head -n 3 "$HERE/out/shares.csv"
    "$VENV/bin/python" "$HERE/check.py" "$HERE/data/sales.csv" "$HERE/out/shares.csv"
fi
say "fleetrun exited with $rc"
exit "$rc"
