#!/usr/bin/env bash
# The digits demo, in one command (from any folder, as often as you like):
#
#   examples/digits/run.sh [--set key=value ...]
#
# 1. creates examples/digits/.venv (python3 -m venv) and installs requirements.txt;
# 2. writes the input: data/images/ (300 PNGs, 2 of them corrupt) and data/labels.txt;
# 3. builds fleetrun (cargo build --release at the repository root);
# 4. runs  target/release/fleetrun run examples/digits/job.toml  (extra arguments are
#    passed on, e.g. --set error_threshold=1 to watch the job fail);
# 5. shows the first rows of the output and where the logs are.
#
# Exits with fleetrun's exit code (0 completed, 42 failed, 2 bad job file).
# PYTHON=/path/to/python3.12 picks the interpreter for the venv (default: python3): any
# CPython 3.9 to 3.15 with a shared libpython.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
OUT_DIR="$HERE/out"
OUT_FILE="$OUT_DIR/parallel_run_step.txt"

# --- 1. the Python environment ------------------------------------------------------
example_venv

# --- 2. the input data --------------------------------------------------------------
say "generating the input"
"$VENV/bin/python" "$HERE/make_data.py"

# --- 3. fleetrun ----------------------------------------------------------------------
example_build

# --- 4. the job -----------------------------------------------------------------------
rm -rf "$OUT_DIR"   # a fresh output folder each time, so the logs hold this run only
example_run "$HERE/job.toml" "$@"

# --- 5. what came out -----------------------------------------------------------------
if [[ -f "$OUT_FILE" ]]; then
    say "output: $OUT_FILE ($(wc -l < "$OUT_FILE") rows), first lines:"
    head -n 5 "$OUT_FILE"
    "$VENV/bin/python" "$HERE/check.py" "$OUT_FILE" || true
fi
if [[ -d "$OUT_DIR/logs" ]]; then
    say "logs: $OUT_DIR/logs/"
    for f in job_result.txt failed_items.csv; do
        if [[ -f "$OUT_DIR/logs/$f" ]]; then
            echo "-- logs/$f"
            head -n 5 "$OUT_DIR/logs/$f"
        fi
    done
    echo "-- the script's own log lines: $OUT_DIR/logs/user/entry_script_log/"
fi
say "fleetrun exited with $rc"
exit "$rc"
