#!/usr/bin/env bash
# On the device: faults under load on the image's stack (Ray 2.58, vLLM 0.26) with the PD pair's
# failover. usage: LIMIT=<s> gpu-faults.sh TEMPLATE OUTDIR FAULTS [faults args]
# (2026-12-03's script, with the faults as an argument; iptables from Debian's packages in .tmpl/.)
set -uo pipefail
if ! command -v iptables >/dev/null; then
  mkdir -p /tmp/ipt && for d in .tmpl/*.deb; do dpkg-deb -x "$d" /tmp/ipt; done
  export PATH=/tmp/ipt/usr/sbin:$PATH LD_LIBRARY_PATH=/tmp/ipt/usr/lib/x86_64-linux-gnu XTABLES_LIBDIR=/tmp/ipt/usr/lib/x86_64-linux-gnu/xtables
  for multi in xtables-legacy-multi xtables-nft-multi; do
    ln -sf "$multi" /tmp/ipt/usr/sbin/iptables
    iptables -w -S INPUT >/dev/null 2>&1 && break
  done
fi
echo "iptables: $(command -v iptables) $(readlink -f "$(command -v iptables)")"; iptables -w -S INPUT | head -2
export PYTHONPATH=/tmp/site:$PWD/constructs VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
mkdir -p "$2"
timeout "${LIMIT:-540}" python3 -m rehearsal.faults --gpu --faults "$3" --template "$1" --report "$2/faults.json" "${@:4}" > "$2/run.log" 2>&1
echo "rc=$?"
grep -E "replica killed:|KV link cut:|PASS|FAIL|PD failover|Traceback|Error" "$2/run.log" | grep -v "Autoscaler\|objects errored\|bytes errored" | cut -c1-300 | sort | uniq -c | sort -rn | head -25
tar czf "$2/serve-logs.tgz" -C /tmp/ray/session_latest/logs serve 2>/dev/null
[ -f "$2/faults.events.jsonl" ] && gzip -f "$2/faults.events.jsonl"
grep -v "Autoscaler status\|^Node status\|^Resources\|^ *[0-9.]*/[0-9.]* \|Pending\|Recent failures\|^ (no \|^Active:\|^Idle:\|^ [0-9] node\|^---\|^Total \|^Usage:\|^Demands:\|^ *$" "$2/run.log" | gzip > "$2/run.log.gz"; rm -f "$2/run.log"
ls -la "$2"
