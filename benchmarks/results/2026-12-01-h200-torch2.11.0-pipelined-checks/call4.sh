#!/usr/bin/env bash
# call 4: the 24-layer step before / with this stop's changes / with the persistent kernel too (ab_call4.py);
# the kernel's rows on the 24-layer stacks (benchmarks/symmetric_kernel.py, tma and persistent); GPU tests
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
D=benchmarks/results/2026-12-01-h200-torch2.11.0-pipelined-checks
cp .devcarry/commit.txt $OUT/ 2>/dev/null
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv -lms 500 > $OUT/smi.csv 2>&1 &
timeout 200 python3 $D/ab_call4.py 4 > $OUT/ab_call4.txt 2>&1; echo "rc=$?" >> $OUT/ab_call4.txt
grep -v "Warning\|_warn_once" $OUT/ab_call4.txt | head -60
timeout 200 python3 benchmarks/symmetric_kernel.py --variants persistent,tma > $OUT/symmetric_kernel.md 2>&1; echo "rc=$?" >> $OUT/symmetric_kernel.md
grep -v "Warning\|_warn_once" $OUT/symmetric_kernel.md | head -60
kill %1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_symmetric_triton.py tests/test_pipelined_checks.py tests/test_elementwise_triton.py tests/test_perf_cuda.py tests/test_launches.py tests/test_gram_newton_schulz.py tests/test_graphs.py > $OUT/gpu-tests.log 2>&1; echo "rc=$?" >> $OUT/gpu-tests.log
grep -E "FAILED|passed|failed|^E |rc=" $OUT/gpu-tests.log | head -30
