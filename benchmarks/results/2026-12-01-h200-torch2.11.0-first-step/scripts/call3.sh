#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
R=$OUT; cp .devcarry/commit.txt $R/
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_perf_cuda.py tests/test_launches.py tests/test_elementwise_triton.py tests/test_symmetric_triton.py > $R/gpu-tests.log 2>&1; echo "rc=$?" >> $R/gpu-tests.log; grep -E "FAILED|passed|failed|^E " $R/gpu-tests.log | head -20
P() { timeout 120 python3 .devcarry/probe_first.py "$@" 2>&1 | grep -A6 "^==" | tee -a $R/first_steps.txt; }
for round in 1 2; do
  modes="ahead noahead"; [ $round = 2 ] && modes=ahead
  for mode in $modes; do
    X=""; [ $mode = noahead ] && X=noahead
    export TRITON_CACHE_DIR=/tmp/cold-$round-$mode; echo "# cold cache, $mode, round $round" >> $R/first_steps.txt
    P llama24 gram+sym+elem dynamo $X
    P llama24 gram+sym+elem dynamo $X
    export TRITON_CACHE_DIR=/tmp/cold-g-$round-$mode
    P gpt2_small gram+elem+graphs dynamo $X
  done
done
