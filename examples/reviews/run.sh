#!/usr/bin/env bash
# The side-input example, in one command (from any folder):
#
#   examples/reviews/run.sh [--set key=value ...]
#
# Writes 200 reviews under data/ (the labels side input and the lexicon model ship in
# reference/ and model/), builds fleetrun
# and runs job.toml from /tmp, to show that the script's paths do not depend on the folder
# fleetrun is started from. Needs only the standard library. Exits with fleetrun's exit code.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"

say "generating the input"
"$PYTHON" "$HERE/make_data.py"
example_build
rm -rf "$HERE/out"
cd /tmp
example_run "$HERE/job.toml" "$@"
if [[ -f "$HERE/out/sentiments.txt" ]]; then
    say "output: $HERE/out/sentiments.txt, first lines:"
    head -n 3 "$HERE/out/sentiments.txt"
    right="$(sort "$HERE/out/sentiments.txt" | join - <(sort "$HERE/data/truth.txt") | awk '$2 == $4' | wc -l)"
    echo "check: $(wc -l < "$HERE/out/sentiments.txt") rows, $right labelled as written"
fi
say "fleetrun exited with $rc"
exit "$rc"
