#!/usr/bin/env bash
# What finalizing costs on S3: a fleet job of N one-item mini-batches (20,000 by default),
# local input, output on the S3 test server, one worker with two runners. Prints when the
# job was first seen Finalizing and Completed (`fleetrun status --json`, polled every
# 0.25 s) and the time between. Not a test; the servers are scripts/services.sh's.
#
#   bench/finalize.sh [N]
#
# BIN (default target/release, built here) holds fleetrun, fleetrun-worker and
# fleetrun-runner. Input and logs live in bench/work/finalize/.
set -euo pipefail
N=${1:-20000}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
BIN=${BIN:-}
if [ -z "$BIN" ]; then
  (cd "$ROOT" && cargo build --release -p fleetrun-producer -p fleetrun-worker -p fleetrun-runner)
  BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
fi
"$ROOT/scripts/services.sh" start
eval "$("$ROOT/scripts/services.sh" env)"
WORK="$ROOT/bench/work/finalize"
rm -rf "$WORK" && mkdir -p "$WORK/in"
cd "$WORK"
python3 - "$N" <<'PY'
import sys
for i in range(int(sys.argv[1])):
    open(f"in/f{i:06d}", "w").write(f"f{i:06d}\n")
PY
printf 'def run(mb):\n    return [open(p).read().strip() for p in mb]\n' > score.py
SUFFIX=$RANDOM$RANDOM
BUCKET=finalize-$SUFFIX
cat > job.toml <<TOML
name = "finalize-bench"
entry_script = "score.py"
output_action = "append_row"
mini_batch_size = 1
process_count_per_node = 2
error_threshold = -1
[input]
files = "in"
[output]
path = "s3://$BUCKET/out"
TOML
export FLEETRUN_AMQP_URL=$FLEETRUN_TEST_AMQP_URL FLEETRUN_REDIS_URL=$FLEETRUN_TEST_REDIS_URL
export FLEETRUN_S3_ENDPOINT_URL=$FLEETRUN_TEST_S3_ENDPOINT FLEETRUN_POOL=finalize-$SUFFIX
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
python3 -c "import boto3; boto3.client('s3', endpoint_url='$FLEETRUN_S3_ENDPOINT_URL', region_name='us-east-1', aws_access_key_id='test', aws_secret_access_key='test').create_bucket(Bucket='$BUCKET')"
"$BIN/fleetrun-worker" --processes 2 --node-id finalize > worker.log 2>&1 &
WORKER=$!
trap 'kill $WORKER 2>/dev/null || true' EXIT
JOB=finalize-$SUFFIX
start=$(date +%s.%N)
"$BIN/fleetrun" submit job.toml --job-id "$JOB" --wait --create-pool > submit.log 2>&1 &
SUBMIT=$!
python3 - "$BIN/fleetrun" "$JOB" "$start" <<'PY'
import json, subprocess, sys, time
fleetrun, job, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
seen = {}
deadline = time.time() + 1800
while time.time() < deadline:
    out = subprocess.run([fleetrun, "status", job, "--json"], capture_output=True, text=True)
    try:
        state = json.loads(out.stdout)["state"]
    except (ValueError, KeyError):
        state = None
    if state and state not in seen:
        seen[state] = time.time() - start
        print(f"{state} at {seen[state]:.1f} s", flush=True)
    if state in ("Completed", "Failed", "Canceled"):
        break
    time.sleep(0.25)
if "Finalizing" in seen and len(seen) > 1:
    print(f"finalizing took at most {max(seen.values()) - seen['Finalizing']:.1f} s")
PY
wait $SUBMIT
tail -2 submit.log
