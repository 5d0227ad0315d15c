#!/usr/bin/env bash
# Installs what the test suite needs beyond the Rust toolchain and CPython, when missing:
# RabbitMQ and Redis servers, strace, Debian's docker-compose, Debian's chromium with its
# chromedriver (the operator page's test drives a headless browser), and Debian's prometheus
# with promtool (the dashboard's test and check-deploy.sh) (one `apt-get update`, then
# one `apt-get install`), moto's S3 server (>= 5.2.5), PyYAML, pandas and pyarrow (pip; the
# tabular tests read DataFrames in the runner's Python), maturin (pip; scripts/build-wheel.sh),
# the digits example's requirements as wheels for CPython 3.10 and 3.12 (pip download, once;
# the wheel's tests install them offline), and cargo-nextest (the test runner scripts/test.sh
# uses; built from crates.io, a few minutes). Each step is skipped when what it installs is
# there, so a machine that has it all needs no network.
set -euo pipefail

# The Python the project uses (pyenv's on the dev and CI machines); PYTHON overrides it.
PYTHON=${PYTHON:-python3}

# The tests run scripts under each CPython the runner serves and check older ones are
# refused: they use pyenv's 3.8 to 3.13 (`fleetrun_tests::pyenv_python`), which the dev and
# CI machines have. Said here, before a test fails on one missing.
for minor in 3.8 3.9 3.10 3.11 3.12 3.13; do
  if ! compgen -G "${PYENV_ROOT:-$HOME/.pyenv}/versions/$minor.*/bin/python$minor" >/dev/null; then
    echo "[install-deps] warning: no CPython $minor under ${PYENV_ROOT:-$HOME/.pyenv}/versions (pyenv install $minor): the tests that run it will fail" >&2
  fi
done

packages=()
command -v redis-server >/dev/null || packages+=(redis-server)
# scripts/test-certs.sh makes the TLS tests' CA and certificates with it.
command -v openssl >/dev/null || packages+=(openssl)
# A ledger test slows Redis's disk syncs with it.
command -v strace >/dev/null || packages+=(strace)
command -v rabbitmq-server >/dev/null || packages+=(rabbitmq-server)
command -v docker-compose >/dev/null || packages+=(docker-compose)
command -v chromium >/dev/null || packages+=(chromium)
command -v chromedriver >/dev/null || packages+=(chromium-driver)
# The dashboard test evaluates every Grafana panel on a real Prometheus; check-deploy.sh runs
# its promtool.
command -v prometheus >/dev/null && command -v promtool >/dev/null || packages+=(prometheus)
if [ ${#packages[@]} -gt 0 ]; then
  echo "[install-deps] apt-get install ${packages[*]}" >&2
  apt-get update -qq
  # The packages' own service start is refused in containers; scripts/services.sh starts them.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
fi

# moto before 5.2.5 answers CompleteMultipartUpload with the wrong XML root.
if ! "$PYTHON" -c 'import moto, sys; sys.exit(tuple(map(int, moto.__version__.split(".")[:3])) < (5, 2, 5))' 2>/dev/null \
   || ! command -v moto_server >/dev/null \
   || ! "$PYTHON" -c 'import yaml, pandas, pyarrow' 2>/dev/null; then
  echo "[install-deps] pip install moto[server]>=5.2.5 pyyaml pandas pyarrow" >&2
  # A Debian-managed interpreter refuses pip installs (PEP 668): say which one to use.
  if ! "$PYTHON" -m pip install -q 'moto[server]>=5.2.5' pyyaml pandas pyarrow; then
    echo "[install-deps] pip failed for $("$PYTHON" -c 'import sys; print(sys.executable)'); set PYTHON to a Python that pip may install into (the python3 the tests' jobs run by default)" >&2
    exit 1
  fi
fi

# scripts/build-wheel.sh builds the `fleetrun` wheel with maturin.
if ! command -v maturin >/dev/null; then
  echo "[install-deps] pip install maturin>=1.9,<2" >&2
  "$PYTHON" -m pip install -q 'maturin>=1.9,<2'
fi

# The wheel's tests (tests/tests/python_package.rs) run the digits example in fresh
# virtualenvs of CPython 3.10 and 3.12 and install its requirements there offline, from these
# wheels (downloaded once; `.complete` says they all came).
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/fleetrun-tests/wheels"
if [ ! -f "$wheels/.complete" ]; then
  echo "[install-deps] pip download scikit-learn pillow into $wheels (CPython 3.10, 3.12)" >&2
  mkdir -p "$wheels"
  for minor in 3.10 3.12; do
    python=$(compgen -G "${PYENV_ROOT:-$HOME/.pyenv}/versions/$minor.*/bin/python$minor" | sort -V | tail -n 1)
    "$python" -m pip download -q --only-binary=:all: -d "$wheels" -r "$(dirname "${BASH_SOURCE[0]}")/../examples/digits/requirements.txt"
  done
  touch "$wheels/.complete"
fi

# nextest runs each test in a process of its own and kills one that outlives its limit
# (.config/nextest.toml); `cargo test` would wait forever on a hung test.
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "[install-deps] cargo install --locked cargo-nextest" >&2
  cargo install --locked cargo-nextest
fi
