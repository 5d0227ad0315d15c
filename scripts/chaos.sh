#!/usr/bin/env bash
# The chaos run: randomised trials of a fleet job, each with several faults at random
# instants (kill -9 of a runner, a worker or the submitter; Redis SIGSTOPped or killed and
# started again; RabbitMQ restarted), checking after each that every line is in the output
# once, the counts are exact and the job ended on its own. See tests/tests/fleet/chaos.rs.
#
#   scripts/chaos.sh                   # 100 trials
#   scripts/chaos.sh --trials 20
#   scripts/chaos.sh --seed 0x1a2b3c   # replay the one trial a failed run named
#   scripts/chaos.sh --profile release # binaries and tests of another cargo profile
#
# The broker and Redis the trials stop are the run's own, on free ports; the S3 server is
# scripts/services.sh's (started if it is not running). Each trial's lines go to stderr,
# and the run's to target/chaos-<time>.log as well.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

trials=100
seed=
profile=dev
while [ $# -gt 0 ]; do
  case $1 in
    --trials) trials=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    *) echo "usage: $0 [--trials N] [--seed SEED] [--profile PROFILE]" >&2; exit 2 ;;
  esac
done

scripts/services.sh start
for name in $(compgen -e); do
  case $name in FLEETRUN_* | AWS_* | CHAOS_*) unset "$name" ;; esac
done
eval "$(scripts/services.sh env)"
cargo build --workspace --profile "$profile"
if [ -n "$seed" ]; then export CHAOS_SEED=$seed; else export CHAOS_TRIALS=$trials; fi
log="${CARGO_TARGET_DIR:-target}/chaos-$(date +%Y%m%d-%H%M%S).log"
mkdir -p "$(dirname "$log")"
echo "[chaos] log: $log" >&2
# libtest, not nextest: a run of 100 trials outlives nextest's per-test limit; each trial's
# waits are bounded by the test itself.
cargo test --profile "$profile" -p fleetrun-tests --features services --test fleet -- \
  --exact chaos::chaos_trials \
  --nocapture 2>&1 | tee "$log"
