#!/usr/bin/env bash
# call 5: what the mirror store costs (mirror_probe.py)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
D=benchmarks/results/2026-12-01-h200-torch2.11.0-identity-epilogue
timeout 240 python3 $D/mirror_probe.py > $OUT/mirror_probe.txt 2>&1; echo "rc=$?" >> $OUT/mirror_probe.txt
cat $OUT/mirror_probe.txt
