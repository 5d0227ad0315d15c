#!/usr/bin/env bash
# Runs each fuzz target (fuzz/: the queue message decoder, the runner protocol frames, the
# job-file reader) for a short while from its seed corpus in fuzz/corpus/, as CI does.
#
#   scripts/fuzz.sh                      # every target, 25 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh wire   # one target, longer
#
# Installs cargo-fuzz from crates.io when missing. cargo-fuzz passes rustc flags only
# nightly accepts (-Zsanitizer=address); the stable toolchain ships the sanitizer runtimes
# and accepts them with RUSTC_BOOTSTRAP=1, so no other toolchain is needed. New inputs
# found go to a scratch folder (the corpus in the repo stays as committed); a crashing
# input is kept in fuzz/artifacts/<target>/, and the run fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=${FUZZ_SECONDS:-25}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(wire protocol job_file)

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "[fuzz] cargo install --locked cargo-fuzz" >&2
  cargo install --locked cargo-fuzz
fi
export RUSTC_BOOTSTRAP=1

scratch=$(mktemp -d "${TMPDIR:-/tmp}/fleetrun-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
for target in "${targets[@]}"; do
  mkdir -p "$scratch/$target" "fuzz/artifacts/$target"
  echo "[fuzz] $target for ${seconds}s" >&2
  # libFuzzer's progress lines (`#1234 NEW ...`) are left out; its findings and final
  # figures are not.
  cargo fuzz run "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -artifact_prefix="fuzz/artifacts/$target/" \
    -print_final_stats=1 2>&1 | { grep -v -E '^#[0-9]+[[:space:]]' || true; }
done
