#!/usr/bin/env bash
# call 1: the identity epilogue against the published form on the 24-layer step, then the GPU tests
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
D=benchmarks/results/2026-12-01-h200-torch2.11.0-identity-epilogue
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv -lms 500 > $OUT/smi.csv 2>&1 &
timeout 150 python3 $D/identity_ab.py 4 > $OUT/identity_ab.txt 2>&1; echo "rc=$?" >> $OUT/identity_ab.txt
cat $OUT/identity_ab.txt | grep -v Warning | head -50
timeout 260 python3 -m pytest -q -p no:cacheprovider tests/test_symmetric_triton.py tests/test_perf_symmetric.py tests/test_gram_newton_schulz.py tests/test_launches.py tests/test_perf_cuda.py > $OUT/gpu-tests.log 2>&1; echo "rc=$?" >> $OUT/gpu-tests.log
grep -E "FAILED|passed|failed|^E |rc=" $OUT/gpu-tests.log | head -30
kill %1
