#!/usr/bin/env bash
# call 5: the one-run GPU step table (benchmarks/gpu_step.py; peers from source on PYTHONPATH: .devcarry/site,
# dion at microsoft/dion 0a059a4, gram-newton-schulz 0.1.6 from its wheel, quack absent), then the gpu tier
# judged for ours-triton (the persistent kernel, the norms from the momentum launch, the flags read later)
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD:$PWD/.devcarry/site"
R=$OUT/r; mkdir -p $R
cp .devcarry/commit.txt $R/
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $R/smi.txt 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/smi.txt 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 500 > $R/clocks.csv 2>&1 &
SMI=$!
ONLY='^ours \((polar_express|newton_schulz|gram_newton_schulz)\)$|^ours \(polar_express\), lever 2 off$|^ours \(gram_newton_schulz, (cuda graphs \+ triton elementwise|triton symmetric \+ elementwise)\)$|^ours \(polar_express, (cuda graphs|triton symmetric \+ elementwise)\)$|torch|dion|gram-newton'
DROP='^(gpt2_small|convnext_t)/(ours \(\w+, triton symmetric \+ elementwise\)|dion \+ triton)$|^llama24/ours \((gram_newton_schulz, cuda graphs \+ triton elementwise|polar_express, cuda graphs)\)$|^convnext_t/gram-newton-schulz|^llama24/dion \+ triton$'
timeout 450 python3 benchmarks/gpu_step.py --sets llama24,gpt2_small,convnext_t --extra-peers --only "$ONLY" --drop "$DROP" \
  --budget 2.5 --timeout 110 --deadline 420 > $R/gpu_step.md 2> $R/gpu_step.err
echo "rc=$?" >> $R/gpu_step.err
kill $SMI
cat $R/gpu_step.md; tail -3 $R/gpu_step.err
( /usr/bin/time -f "%e s" timeout 120 python3 -m harness run --tier gpu --backend cuda --target ours-triton --jobs 4 --threads 1 --out $R/ours-triton > $R/ours-triton.log 2>&1; echo "rc=$?" >> $R/ours-triton.log )
tail -4 $R/ours-triton.log; cat $R/ours-triton/summary.md 2>/dev/null | head -30
