#!/usr/bin/env bash
# Gram NS and the standard iteration on the hard spectra at 2048 rows, on CUDA: the published form (cuBLAS and
# the blocked products) against the Triton kernel's W = aI + bA + cA² form, fp16 and bf16, Polar Express
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
A="--sizes 2048x4096,2048x2048 --device cuda --dtypes fp16,bf16 --schedules polar_express"
timeout 280 python3 benchmarks/gram_ns_accuracy.py $A > $OUT/published.md 2>&1; echo "rc=$?" >> $OUT/published.md
cat $OUT/published.md
timeout 280 python3 benchmarks/gram_ns_accuracy.py $A --triton > $OUT/kernel.md 2>&1; echo "rc=$?" >> $OUT/kernel.md
cat $OUT/kernel.md
