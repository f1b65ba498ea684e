#!/usr/bin/env bash
# On the device: the fault rehearsal with the 9B's size, served through the node cache as a warm
# node holds it (rehearsal/warm_node.py), each replica start split (observability/replica_start.py).
# usage: LIMIT=<s> gpu-start.sh TEMPLATE OUTDIR FAULTS [faults args]
# Needs: the image's stack in /tmp/site (../shared/gpu), boto3 + moto wheels in /tmp/whs3.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -d /tmp/site-s3 ]; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site-s3 /tmp/whs3/*.whl
fi
# The stack's own versions first; the S3 client and moto's server after them.
export PYTHONPATH=/tmp/site:$PWD/constructs:$PWD:/tmp/site-s3 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
if [ ! -f /tmp/q9/config.json ]; then
  python3 "$here/cold_start.py" gen /tmp/q9 2>&1 | tail -1
  ls -la /tmp/q9 | grep safetensors | head -3
fi
mkdir -p "$2"
start=$(date +%s)
timeout "${LIMIT:-540}" python3 -m rehearsal.faults --gpu --weights ${WEIGHTS:-/tmp/q9} --faults "$3" --template "$1" \
  --report "$2/faults.json" "${@:4}" > "$2/run.log" 2>&1
echo "rc=$? wall=$(( $(date +%s) - start ))s"
grep -E "replica [a-z0-9]+: |node cache|PASS|FAIL|Traceback|Error|== fault" "$2/run.log" | grep -v "objects errored\|bytes errored" | cut -c1-400 | head -30
tar czf "$2/serve-logs.tgz" -C /tmp/ray/session_latest/logs serve 2>/dev/null
[ -f "$2/faults.events.jsonl" ] && gzip -f "$2/faults.events.jsonl"
grep -v "Autoscaler status\|^Node status\|^Resources\|^ *[0-9.]*/[0-9.]* \|Pending\|Recent failures\|^ (no \|^Active:\|^Idle:\|^ [0-9] node\|^---\|^Total \|^Usage:\|^Demands:\|^ *$\|GET /metrics" "$2/run.log" | gzip > "$2/run.log.gz"; rm -f "$2/run.log"
ls -la "$2"
