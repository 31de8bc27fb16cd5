#!/usr/bin/env bash
BUDGET=${BUDGET:-565}; source benchmarks/device_steps.sh
P="python3 benchmarks/fused_prefetch.py --set attention"
show() { grep -E "^\||rounds|not built|Error" $OUT/$1.txt | grep -v "^|---" | cut -c1-60,170-; }
Q="model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280"
step pairs_q1024 100 $P $Q; show pairs_q1024
step profile 50 python3 benchmarks/fused_kernels.py $Q fused.pdl=false; tail -12 $OUT/profile.txt
step profile 50 python3 benchmarks/fused_kernels.py $Q fused.pdl=false fused.fold_attention=false; tail -14 $OUT/profile.txt
step pairs_l1024 100 $P model=llama-3.2-1b bs=1 context_len=1024 cache_len=1280; show pairs_l1024
step pairs_q4096 100 $P model=qwen3-0.6b bs=1 context_len=4096 cache_len=4352; show pairs_q4096
step pairs_study 90 $P model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127; show pairs_study
echo "total $(( $(date +%s) - device_start_s ))s"
