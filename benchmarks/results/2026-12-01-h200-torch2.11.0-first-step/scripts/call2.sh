#!/usr/bin/env bash
# Call 2: GPU tests (compile-ahead among them), first steps with and without compile-ahead (cold and warm
# Triton caches, fresh processes), the gpu tier for ours-triton, the ci tier on CUDA for ours-graphs.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
R=$OUT; cp .devcarry/commit.txt $R/
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee $R/versions.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_perf_cuda.py tests/test_launches.py tests/test_elementwise_triton.py tests/test_symmetric_triton.py > $R/gpu-tests.log 2>&1; echo "rc=$?" >> $R/gpu-tests.log; tail -3 $R/gpu-tests.log
P() { timeout 120 python3 .devcarry/probe_first.py "$@" 2>&1 | grep -A6 "^==" | tee -a $R/first_steps.txt; }
for round in 1 2; do
  modes="ahead noahead"; [ $round = 2 ] && modes=ahead
  for mode in $modes; do
    X=""; [ $mode = noahead ] && X=noahead
    export TRITON_CACHE_DIR=/tmp/cold-$round-$mode; echo "# cold cache, $mode, round $round" >> $R/first_steps.txt
    P llama24 gram+sym+elem dynamo $X
    P llama24 gram+sym+elem dynamo $X   # the same cache, now warm
    export TRITON_CACHE_DIR=/tmp/cold-g-$round-$mode
    P gpt2_small gram+elem+graphs dynamo $X
  done
done
export TRITON_CACHE_DIR=/tmp/cold-x; P llama24 gram+sym+elem; P llama24 gram+sym+elem
unset TRITON_CACHE_DIR
( /usr/bin/time -f "%e s" timeout 100 python3 -m harness run --tier gpu --backend cuda --target ours-triton --jobs 4 --threads 1 --out $R/ours-triton > $R/ours-triton.log 2>&1; echo "rc=$?" >> $R/ours-triton.log )
tail -4 $R/ours-triton.log
( /usr/bin/time -f "%e s" timeout 170 python3 -m harness run --tier ci --backend cuda --target ours-graphs --jobs 12 --threads 1 --out $R/ci-ours-graphs > $R/ci-ours-graphs.log 2>&1; echo "rc=$?" >> $R/ci-ours-graphs.log )
tail -4 $R/ci-ours-graphs.log
for d in ours-triton ci-ours-graphs; do rm -f $R/$d/report.html $R/$d/results.parquet; done
cd $R && tar czf runs.tgz ours-triton ci-ours-graphs && rm -rf ours-triton ci-ours-graphs
