#!/usr/bin/env bash
# The attention's programs on 4 or 8 warps, 2 to 4 stages: the three launches' split-KV at long contexts (bs=1), the
# folded kernel at the targets (Qwen3-0.6B bs=1 context 1024, bs=8 context 16384, Llama-3.2-1B's study workload)
BUDGET=${BUDGET:-575}; source benchmarks/device_steps.sh
show() { grep -E "^\||rounds|not built|Error" $OUT/$1.txt | grep -v "^|---" | awk -F"|" "NF>5{print \$2 \"|\" \$4 \"|\" \$6; next}{print}" | tail -${2:-8}; }
P="python3 benchmarks/fused_prefetch.py --set attention_warps"
step q16k 60 $P model=qwen3-0.6b bs=1 context_len=16384 cache_len=16640; show q16k
step q1k 50 $P model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280; show q1k
step b8 60 $P model=qwen3-0.6b bs=8 context_len=16384; show b8
step l16k 50 $P model=llama-3.2-1b bs=1 context_len=16384 cache_len=16640; show l16k
step q4k 50 $P model=qwen3-0.6b bs=1 context_len=4096 cache_len=4352; show q4k
step l32 50 $P model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127; show l32
echo "total $(( $(date +%s) - device_start_s ))s"
