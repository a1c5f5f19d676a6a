#!/usr/bin/env bash
# call 6: where the 24-layer step leaves the GPU idle (gaps_probe.py)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
D=benchmarks/results/2026-12-01-h200-torch2.11.0-identity-epilogue
timeout 240 python3 $D/gaps_probe.py > $OUT/gaps_probe.txt 2>&1; echo "rc=$?" >> $OUT/gaps_probe.txt
grep -v "Warning\|_warn_once" $OUT/gaps_probe.txt
