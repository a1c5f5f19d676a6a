#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
R=$OUT; cp .devcarry/commit.txt $R/
export TRITON_CACHE_DIR=/tmp/cold-tests
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_perf_cuda.py tests/test_launches.py tests/test_elementwise_triton.py tests/test_symmetric_triton.py tests/test_dion2.py > $R/gpu-tests.log 2>&1; echo "rc=$?" >> $R/gpu-tests.log; grep -E "FAILED|passed|failed|^E " $R/gpu-tests.log | head -20
