#!/usr/bin/env bash
# The attention's three launches asking L2 for the MLP's weights (split-KV or merge), paired against the fold rule,
# folded and unfolded; then the targets verified on this tree
BUDGET=${BUDGET:-570}; source benchmarks/device_steps.sh
show() { grep -E "^\||rounds|not built|Error" $OUT/$1.txt | grep -v "^|---" | awk -F"|" "NF>5{print \$2 \"|\" \$4 \"|\" \$6; next}{print}" | tail -${2:-6}; }
P="python3 benchmarks/fused_prefetch.py --set attention"
step q1024 60 $P model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280; show q1024
step l1024 70 $P model=llama-3.2-1b bs=1 context_len=1024 cache_len=1280; show l1024
step q512 55 $P --only 2,0,1,3,4 model=qwen3-0.6b bs=1 context_len=512 cache_len=768; show q512
step m1024 70 $P model=qwen3-1.7b bs=1 context_len=1024 cache_len=1280; show m1024
step l512 60 $P --only 2,1,3,4 model=llama-3.2-1b bs=1 context_len=512 cache_len=768; show l512
step targets 90 python3 -m harness -m mode=fused model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127; grep -E "FINISHED|FAILED|sweep wall|ms/step" $OUT/targets.txt | cut -c1-160 | tail -4
step targets2 60 python3 -m harness -m mode=fused model=qwen3-0.6b bs=1 context_len=1024; grep -E "FINISHED|FAILED|sweep wall|ms/step" $OUT/targets2.txt | cut -c1-160 | tail -4
echo "total $(( $(date +%s) - device_start_s ))s"
