# Shared by the examples' run.sh scripts: source it, then call the steps in order.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
#   example_venv        # $HERE/.venv with $HERE/requirements.txt (skipped when none)
#   example_build       # cargo build --release at the repository root
#   example_run job.toml [fleetrun arguments...]   # sets $rc to fleetrun's exit code
#
# Expects HERE (the example's folder). PYTHON=/path/to/python3.12 picks the interpreter for
# the venv (default: python3): any CPython 3.9 to 3.15 with a shared libpython.

ROOT="$(cd "$HERE/../.." && pwd -P)"
PYTHON="${PYTHON:-python3}"
VENV="$HERE/.venv"

say() { printf '\n== %s\n' "$*"; }

example_venv() {
    [[ -f "$HERE/requirements.txt" ]] || return 0
    local stamp="$VENV/.requirements.sha256" want
    if [[ ! -x "$VENV/bin/python" ]]; then
        say "creating $VENV with $("$PYTHON" --version 2>&1)"
        rm -rf "$VENV"
        if ! "$PYTHON" -m venv "$VENV"; then
            rm -rf "$VENV"
            echo "error: '$PYTHON -m venv' failed. On Debian/Ubuntu: apt-get install python3-venv" >&2
            exit 1
        fi
    fi
    want="$(sha256sum "$HERE/requirements.txt" | cut -d' ' -f1)"
    if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
        say "installing $(grep -v '^#' "$HERE/requirements.txt" | xargs) into .venv (quietly)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            -r "$HERE/requirements.txt"
        echo "$want" > "$stamp"
    fi
}

example_build() {
    say "building fleetrun (cargo build --release)"
    (cd "$ROOT" && cargo build --release)
}

example_run() {
    local job="$1"
    shift
    say "fleetrun run ${job#"$ROOT/"} $*"
    set +e
    "$ROOT/target/release/fleetrun" run "$job" "$@"
    rc=$?
    set -e
}
