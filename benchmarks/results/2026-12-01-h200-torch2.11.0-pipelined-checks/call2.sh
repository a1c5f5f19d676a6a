#!/usr/bin/env bash
# call 2: the four modes of ab_call2.py (flags later, norms from the momentum launch), then the GPU tests
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
D=benchmarks/results/2026-12-01-h200-torch2.11.0-pipelined-checks
cp .devcarry/commit.txt $OUT/ 2>/dev/null
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv -lms 500 > $OUT/smi.csv 2>&1 &
timeout 280 python3 $D/ab_call2.py 4 > $OUT/ab_call2.txt 2>&1; echo "rc=$?" >> $OUT/ab_call2.txt
grep -v "Warning\|_warn_once" $OUT/ab_call2.txt | head -80
kill %1
timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_pipelined_checks.py tests/test_graphs.py tests/test_perf_cuda.py tests/test_elementwise_triton.py tests/test_launches.py tests/test_gram_newton_schulz.py tests/test_symmetric_triton.py tests/test_perf_passes.py > $OUT/gpu-tests.log 2>&1; echo "rc=$?" >> $OUT/gpu-tests.log
grep -E "FAILED|passed|failed|^E |rc=" $OUT/gpu-tests.log | head -30
