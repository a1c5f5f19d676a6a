#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
R=$OUT; cd "$PWD"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
for m in serial threads; do TRITON_CACHE_DIR=$(mktemp -d) timeout 120 python3 .devcarry/compile_threads.py $m 8 2>&1 | tail -2; done
TRITON_CACHE_DIR=$(mktemp -d) timeout 120 python3 .devcarry/compile_threads.py threads 16 2>&1 | tail -2
export TRITON_CACHE_DIR=/tmp/tc1
timeout 150 python3 .devcarry/probe_first.py llama24 gram+sym+elem dynamo 2>&1 | tail -3
timeout 150 python3 .devcarry/probe_first.py llama24 gram+sym+elem dynamo 2>&1 | tail -3
timeout 150 python3 .devcarry/probe_first.py llama24 gram+sym+elem 2>&1 | tail -3
timeout 150 python3 .devcarry/probe_first.py llama24 gram+sym+elem dynamo prof > $R/prof_llama.txt 2>&1; head -3 $R/prof_llama.txt | cut -c1-400
timeout 100 python3 .devcarry/probe_first.py gpt2_small gram+elem+graphs dynamo prof > $R/prof_gpt2.txt 2>&1; head -2 $R/prof_gpt2.txt | cut -c1-400
