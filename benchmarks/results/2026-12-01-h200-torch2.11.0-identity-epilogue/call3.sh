#!/usr/bin/env bash
# call 3: the epilogue that transposes only diagonal tiles, against 963170c's, per stack and on the 24-layer
# step; then the GPU tests of the kernel
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
D=benchmarks/results/2026-12-01-h200-torch2.11.0-identity-epilogue
timeout 300 python3 $D/kernel_ab.py 4 > $OUT/kernel_ab.txt 2>&1; echo "rc=$?" >> $OUT/kernel_ab.txt
grep -v "Warning\|_warn_once" $OUT/kernel_ab.txt
[ -n "${SKIP_TESTS:-}" ] || timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_symmetric_triton.py tests/test_perf_cuda.py tests/test_launches.py tests/test_gram_newton_schulz.py > $OUT/gpu-tests.log 2>&1; echo "rc=$?" >> $OUT/gpu-tests.log
grep -E "FAILED|passed|failed|^E |rc=" $OUT/gpu-tests.log | head -30
