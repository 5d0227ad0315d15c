#!/usr/bin/env bash
# Builds the `fleetrun` wheel with maturin (pyproject.toml): one wheel per platform, tagged
# py3-none-<platform>, for every CPython from 3.9 to 3.13 (the runner loads the job's own
# libpython at run time). `pip install` of it puts on the virtualenv's PATH
#
#   fleetrun, fleetrun-worker, fleetrun-runner (with libfleetrun_runner.so beside it)
#
# and the pure-Python package `fleetrun` (python/fleetrun) in its site-packages.
#
#   scripts/build-wheel.sh                 # release build, into dist/
#   scripts/build-wheel.sh --debug         # the debug build `cargo build --workspace` made
#   scripts/build-wheel.sh --out DIR       # the wheel into DIR instead of dist/
#
# maturin builds `fleetrun` (the producer crate's binary, bindings = "bin"); the worker and
# the runner are built here by cargo and staged in target/wheel-data/scripts, which maturin
# packs as the wheel's `scripts` data (installed beside `fleetrun`). The platform tag is
# the manylinux one maturin's check finds `fleetrun` needs; the newest glibc symbol version
# any of the four files needs is printed at the end (built on Debian 12: glibc 2.34). They
# link nothing beyond libc, libm, libgcc_s and the loader.
#
# Needs maturin (scripts/install-deps.sh installs it) and the Rust toolchain; the wheel's
# user needs neither.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

profile=release
out=dist
while [ $# -gt 0 ]; do
  case $1 in
    --debug | --profile=dev) profile=dev ;;
    --out) out=$2; shift ;;
    --out=*) out=${1#--out=} ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "build-wheel: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if ! command -v maturin >/dev/null; then
  echo "build-wheel: maturin is not installed: run scripts/install-deps.sh (or pip install 'maturin>=1.9,<2')" >&2
  exit 1
fi

# The debug build is the one `cargo build --workspace` makes (scripts/test.sh): built the
# same way here, it is already fresh and nothing is rebuilt. A release build builds the three
# binaries' crates only (maturin then relinks `fleetrun` stripped).
if [ "$profile" = dev ]; then
  cargo build --workspace
  built=target/debug
  maturin_profile=(--profile dev)
else
  cargo build --release -p fleetrun-producer -p fleetrun-worker -p fleetrun-runner
  built=target/release
  maturin_profile=(--release --strip)
fi

# What maturin packs as the wheel's scripts, stripped of debug info (a debug build's binaries
# are mostly that).
staged=target/wheel-data/scripts
rm -rf target/wheel-data
mkdir -p "$staged"
for file in fleetrun-worker fleetrun-runner libfleetrun_runner.so; do
  strip --strip-debug -o "$staged/$file" "$built/$file"
done

mkdir -p "$out"
rm -f "$out"/fleetrun-*.whl
maturin build "${maturin_profile[@]}" --out "$out" >&2

wheel=$(ls "$out"/fleetrun-*.whl)
# The newest glibc symbol version any of the binaries needs: the oldest glibc it runs on.
glibc=$(
  for file in "$built/fleetrun" "$staged"/*; do
    objdump -T "$file" | grep -o 'GLIBC_[0-9.]*' || true
  done | sort -uV | tail -n 1
)
echo "build-wheel: $wheel (needs ${glibc/_/ } or newer)" >&2
echo "$wheel"
