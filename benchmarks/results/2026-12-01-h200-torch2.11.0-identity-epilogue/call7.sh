#!/usr/bin/env bash
# call 7: the 24-layer step's host work under cProfile (host_probe.py)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
D=benchmarks/results/2026-12-01-h200-torch2.11.0-identity-epilogue
timeout 200 python3 $D/host_probe.py > $OUT/host_probe.txt 2>&1; echo "rc=$?" >> $OUT/host_probe.txt
grep -v "Warning\|_warn_once" $OUT/host_probe.txt | head -120
