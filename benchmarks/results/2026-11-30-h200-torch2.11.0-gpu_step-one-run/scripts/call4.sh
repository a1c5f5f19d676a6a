#!/usr/bin/env bash
# Device call 4: the one-run GPU step table, every column (peers' 24-layer rows first among the peers).
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD:$PWD/.devcarry/site"
R=$OUT/r; mkdir -p $R
cp .devcarry/commit.txt $R/
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $R/smi.txt 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/smi.txt 2>&1
ONLY='^ours \((polar_express|newton_schulz|gram_newton_schulz)\)$|^ours \(polar_express\), lever 2 off$|^ours \(gram_newton_schulz, (cuda graphs \+ triton elementwise|triton symmetric \+ elementwise)\)$|^ours \(polar_express, (cuda graphs|triton symmetric \+ elementwise)\)$|torch|dion|gram-newton'
DROP='^(gpt2_small|convnext_t)/(ours \(\w+, triton symmetric \+ elementwise\)|dion \+ triton)$|^llama24/ours \((gram_newton_schulz, cuda graphs \+ triton elementwise|polar_express, cuda graphs)\)$|^convnext_t/gram-newton-schulz'
timeout 588 python3 benchmarks/gpu_step.py --sets llama24,gpt2_small,convnext_t --extra-peers --only "$ONLY" --drop "$DROP" \
  --budget 2.5 --timeout 130 --deadline 570 > $R/gpu_step.md 2> $R/gpu_step.err
echo "rc=$?" >> $R/gpu_step.err
cd $OUT && tar czf r.tgz r && rm -rf r
