#!/usr/bin/env bash
# call 2: the mainloop probe, then the gpu tier judged for ours-triton (the W = aI + bA + cA² path engaged)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
D=benchmarks/results/2026-12-01-h200-torch2.11.0-identity-epilogue
cp .devcarry/commit.txt $OUT/
timeout 200 python3 $D/mainloop_probe.py > $OUT/mainloop_probe.txt 2>&1; echo "rc=$?" >> $OUT/mainloop_probe.txt
cat $OUT/mainloop_probe.txt
( /usr/bin/time -f "%e s" timeout 170 python3 -m harness run --tier gpu --backend cuda --target ours-triton --jobs 4 --threads 1 --out $OUT/ours-triton > $OUT/ours-triton.log 2>&1; echo "rc=$?" >> $OUT/ours-triton.log )
tail -25 $OUT/ours-triton.log
