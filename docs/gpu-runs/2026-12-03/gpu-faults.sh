#!/usr/bin/env bash
# On the device: the KV-cut fault under load on the image's stack. usage: gpu-faults.sh TEMPLATE OUTDIR [faults args]
# The 2026-12-04 script with the faults fixed to kv (the one that ran on 2026-12-03 is at c2eb09c in git;
# the successor differs only in its summary lines and in gzipping the events).
exec bash "$(dirname "$0")/../2026-12-04/gpu-faults.sh" "$1" "$2" kv "${@:3}"
