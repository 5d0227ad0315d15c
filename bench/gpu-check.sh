#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py): fleetrun vs a plain PyTorch loop over the same
# generated images on this machine's NVIDIA GPU(s), with the GPU-busy split and NVML's view.
# Needs PyTorch and a CUDA device; downloads nothing. Under five minutes with the defaults.
#
#   bench/gpu-check.sh [--images N] [--batch B]
#
# Builds the release binaries first ($CARGO_TARGET_DIR/release, else target/release), unless
# FLEETRUN_BIN_DIR names a folder holding them already. PYTHON picks the interpreter (the one
# with PyTorch; default python3), which the job's runners use too.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd "$HERE/.." && pwd -P)"
PYTHON="${PYTHON:-python3}"

if [[ -z "${FLEETRUN_BIN_DIR:-}" ]]; then
    echo "== building fleetrun (cargo build --release)"
    (cd "$ROOT" && cargo build --release)
    FLEETRUN_BIN_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/release"
fi
exec "$PYTHON" "$HERE/gpu_check.py" --bin-dir "$FLEETRUN_BIN_DIR" "$@"
