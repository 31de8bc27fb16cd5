#!/usr/bin/env bash
# The three launches' chunks: 264 programs (the fold's aim, up to 64 chunks a KV head) against 128 and 64, where the
# rule unfolds, and against the fold where it folds (Qwen3-0.6B and Qwen3-1.7B at context 1024)
BUDGET=${BUDGET:-575}; source benchmarks/device_steps.sh
show() { grep -E "^\||rounds|not built|Error" $OUT/$1.txt | grep -v "^|---" | awk -F"|" "NF>5{print \$2 \"|\" \$4 \"|\" \$6; next}{print}" | tail -${2:-6}; }
P="python3 benchmarks/fused_prefetch.py --set unfolded_chunks"
step q1024 45 $P --only 1,2,3,4 model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280; show q1024
step l1024 45 $P --only 1,2,3,4 model=llama-3.2-1b bs=1 context_len=1024 cache_len=1280; show l1024
step q2048 40 $P --only 2,3,4 model=qwen3-0.6b bs=1 context_len=2048 cache_len=2304; show q2048
step l2048 40 $P --only 2,3,4 model=llama-3.2-1b bs=1 context_len=2048 cache_len=2304; show l2048
step m1024 50 $P --only 1,2,3 model=qwen3-1.7b bs=1 context_len=1024 cache_len=1280; show m1024
step q4096 45 $P --only 2,3,4 model=qwen3-0.6b bs=1 context_len=4096 cache_len=4352; show q4096
step q768 40 $P --only 0,1,4 model=qwen3-0.6b bs=1 context_len=768 cache_len=1024; show q768
step l512 40 $P --only 2,4 model=llama-3.2-1b bs=1 context_len=512 cache_len=768; show l512
step q8b 90 $P --only 2,3 model=qwen3-8b bs=1 context_len=1024 cache_len=1280; show q8b
echo "total $(( $(date +%s) - device_start_s ))s"
