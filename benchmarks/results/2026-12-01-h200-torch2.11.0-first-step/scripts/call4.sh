#!/usr/bin/env bash
# Call 4: GPU tests; first steps with compile-ahead (cold/warm) after the default-dtype fix; our fastest rows
# and torch.optim.Muon in one gpu_step run on a cold Triton cache.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
R=$OUT; cp .devcarry/commit.txt $R/
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_perf_cuda.py tests/test_launches.py tests/test_elementwise_triton.py tests/test_symmetric_triton.py > $R/gpu-tests.log 2>&1; echo "rc=$?" >> $R/gpu-tests.log; grep -E "FAILED|passed|failed|^E " $R/gpu-tests.log | head -20
P() { timeout 120 python3 .devcarry/probe_first.py "$@" 2>&1 | grep -A6 "^==" | tee -a $R/first_steps.txt; }
for round in 1 2; do
  for mode in ahead noahead; do
    X=""; [ $mode = noahead ] && X=noahead
    export TRITON_CACHE_DIR=/tmp/cold-$round-$mode; echo "# cold cache, $mode, round $round" >> $R/first_steps.txt
    P llama24 gram+sym+elem dynamo $X
    [ $round = 1 ] && P llama24 gram+sym+elem dynamo $X
    [ $round = 1 ] && { export TRITON_CACHE_DIR=/tmp/cold-g-$round-$mode; P gpt2_small gram+elem+graphs dynamo $X; }
  done
done
export TRITON_CACHE_DIR=/tmp/cold-bench
ONLY='^ours \(gram_newton_schulz, (cuda graphs \+ triton elementwise|triton symmetric \+ elementwise)\)$|^ours \(polar_express, (cuda graphs|triton symmetric \+ elementwise)\)$|^ours \(polar_express\)$|torch'
DROP='^(gpt2_small|convnext_t)/ours \(\w+, triton symmetric \+ elementwise\)$|^llama24/ours \((gram_newton_schulz, cuda graphs \+ triton elementwise|polar_express, cuda graphs)\)$'
timeout 330 python3 benchmarks/gpu_step.py --sets llama24,gpt2_small,convnext_t --only "$ONLY" --drop "$DROP" \
  --budget 2.5 --timeout 110 --deadline 300 > $R/gpu_step.md 2> $R/gpu_step.err
echo "rc=$?" >> $R/gpu_step.err
cat $R/gpu_step.md; tail -3 $R/gpu_step.err
