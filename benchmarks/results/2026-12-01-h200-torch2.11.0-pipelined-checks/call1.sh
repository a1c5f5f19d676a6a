#!/usr/bin/env bash
# call 1: Gram flags read one megabatch later against at once (pipeline_ab.py), the memory-bound passes
# (elementwise_sweep.py), then the GPU tests this change touches
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
D=benchmarks/results/2026-12-01-h200-torch2.11.0-pipelined-checks
git rev-parse HEAD > $OUT/commit.txt 2>/dev/null; cp .devcarry/commit.txt $OUT/ 2>/dev/null
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv -lms 500 > $OUT/smi.csv 2>&1 &
timeout 200 python3 $D/pipeline_ab.py 4 > $OUT/pipeline_ab.txt 2>&1; echo "rc=$?" >> $OUT/pipeline_ab.txt
grep -v "Warning\|_warn_once" $OUT/pipeline_ab.txt | head -40
timeout 200 python3 $D/elementwise_sweep.py > $OUT/elementwise_sweep.txt 2>&1; echo "rc=$?" >> $OUT/elementwise_sweep.txt
grep -v "Warning\|_warn_once" $OUT/elementwise_sweep.txt | head -120
kill %1
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_pipelined_checks.py tests/test_graphs.py tests/test_perf_cuda.py tests/test_elementwise_triton.py tests/test_launches.py tests/test_gram_newton_schulz.py > $OUT/gpu-tests.log 2>&1; echo "rc=$?" >> $OUT/gpu-tests.log
grep -E "FAILED|passed|failed|^E |rc=" $OUT/gpu-tests.log | head -30
