#!/usr/bin/env bash
# call 3: the persistent form of the symmetric kernel against "tma" on the 24-layer stacks (persistent_probe.py)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
D=benchmarks/results/2026-12-01-h200-torch2.11.0-pipelined-checks
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv -lms 500 > $OUT/smi.csv 2>&1 &
timeout 400 python3 $D/persistent_probe.py time 5 > $OUT/persistent_probe.txt 2>&1; echo "rc=$?" >> $OUT/persistent_probe.txt
grep -v "Warning\|_warn_once" $OUT/persistent_probe.txt | head -80
kill %1
