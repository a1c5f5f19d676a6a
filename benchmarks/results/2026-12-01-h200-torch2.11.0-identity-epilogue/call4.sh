#!/usr/bin/env bash
# call 4: launch sweep of the kernel with this stop's epilogue
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
D=benchmarks/results/2026-12-01-h200-torch2.11.0-identity-epilogue
timeout 300 python3 $D/launch_sweep.py > $OUT/launch_sweep.txt 2>&1; echo "rc=$?" >> $OUT/launch_sweep.txt
cat $OUT/launch_sweep.txt
