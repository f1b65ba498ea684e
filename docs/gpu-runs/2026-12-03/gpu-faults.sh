#!/usr/bin/env bash
# On the device: the KV-cut fault under load on the image's stack. usage: gpu-faults.sh TEMPLATE OUTDIR [faults args]
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
export PYTHONPATH=/tmp/site:$PWD/constructs VLLM_USE_FLASHINFER_SAMPLER=0
mkdir -p "$2"
timeout "${LIMIT:-540}" python3 -m rehearsal.faults --gpu --faults kv --template "$1" --report "$2/faults.json" "${@:3}" > "$2/run.log" 2>&1
echo "rc=$?"
grep -E "KV link cut:|PASS|FAIL" "$2/run.log" | tail -3
tar czf "$2/serve-logs.tgz" -C /tmp/ray/session_latest/logs serve 2>/dev/null
grep -v "Autoscaler status\|^Node status\|^Resources\|^ *[0-9.]*/[0-9.]* \|Pending\|Recent failures\|^ (no \|^Active:\|^Idle:\|^ [0-9] node\|^---\|^Total \|^Usage:\|^Demands:\|^ *$" "$2/run.log" | gzip > "$2/run.log.gz"; rm -f "$2/run.log"
ls -la "$2"
