#!/usr/bin/env bash
# The three launches' aim in the models no pair had covered past 256 slots: Qwen3-4B and Llama-3.1-8B at bs=1 context
# 2048, Qwen3-1.7B at 2048 and 4096: the rule (128 programs) against 264 and 256
BUDGET=${BUDGET:-520}; source benchmarks/device_steps.sh
show() { grep -E "^\||rounds|not built|Error" $OUT/$1.txt | grep -v "^|---" | awk -F"|" "NF>5{print \$2 \"|\" \$4 \"|\" \$6; next}{print}" | tail -${2:-6}; }
P="python3 benchmarks/fused_prefetch.py --set unfolded_chunks --only 0,2,5"
step m2k 50 $P model=qwen3-1.7b bs=1 context_len=2048 cache_len=2304; show m2k
step m4k 50 $P model=qwen3-1.7b bs=1 context_len=4096 cache_len=4352; show m4k
step f2k 90 $P model=qwen3-4b bs=1 context_len=2048 cache_len=2304; show f2k
step e2k 120 $P model=llama-3.1-8b bs=1 context_len=2048 cache_len=2304; show e2k
echo "total $(( $(date +%s) - device_start_s ))s"
