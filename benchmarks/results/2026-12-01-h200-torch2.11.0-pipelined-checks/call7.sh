#!/usr/bin/env bash
# call 7: the GPU tests of call 6 again after the rehearsal test's fix
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
cp .devcarry/commit.txt $OUT/
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_launches.py tests/test_perf_cuda.py tests/test_pipelined_checks.py tests/test_symmetric_triton.py -k "not int32" > $OUT/gpu-tests.log 2>&1; echo "rc=$?" >> $OUT/gpu-tests.log
grep -E "FAILED|passed|failed|^E |rc=" $OUT/gpu-tests.log | head -20
