#!/usr/bin/env bash
# The three launches' chunks past context 2048 at bs=1: the rule (128 programs: 16 chunks a KV head) against 264
# (64 chunks), 256 (32) and 64 (8), at contexts 2048 to 16384; the split-KV's profile at 16384
BUDGET=${BUDGET:-575}; source benchmarks/device_steps.sh
show() { grep -E "^\||rounds|not built|Error" $OUT/$1.txt | grep -v "^|---" | awk -F"|" "NF>5{print \$2 \"|\" \$4 \"|\" \$6; next}{print}" | tail -${2:-6}; }
P="python3 benchmarks/fused_prefetch.py --set unfolded_chunks"
step q16k 50 $P --only 0,2,4,5 model=qwen3-0.6b bs=1 context_len=16384 cache_len=16640; show q16k
step l16k 50 $P --only 0,2,4,5 model=llama-3.2-1b bs=1 context_len=16384 cache_len=16640; show l16k
step q8k 45 $P --only 0,2,5 model=qwen3-0.6b bs=1 context_len=8192 cache_len=8448; show q8k
step q4k 40 $P --only 0,5 model=qwen3-0.6b bs=1 context_len=4096 cache_len=4352; show q4k
step q2k 40 $P --only 0,5 model=qwen3-0.6b bs=1 context_len=2048 cache_len=2304; show q2k
step l2k 40 $P --only 0,5 model=llama-3.2-1b bs=1 context_len=2048 cache_len=2304; show l2k
step q8b 100 $P --only 0,2,5 model=qwen3-8b bs=1 context_len=16384 cache_len=16640; show q8b
step p16k 40 python3 benchmarks/fused_kernels.py --variant unfolded_chunks:0 model=qwen3-0.6b bs=1 context_len=16384 cache_len=16640 fused.pdl=false; tail -14 $OUT/p16k.txt
echo "total $(( $(date +%s) - device_start_s ))s"
