#!/usr/bin/env bash
# The rule with the merge asking ahead: the GPU tests, pairs where no run had measured it, a verified run where the
# merge asks
BUDGET=${BUDGET:-575}; source benchmarks/device_steps.sh
show() { grep -E "^\||rounds|not built|Error" $OUT/$1.txt | grep -v "^|---" | awk -F"|" "NF>5{print \$2 \"|\" \$4 \"|\" \$6; next}{print}" | tail -${2:-5}; }
step tests 70 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "three_launches or asks_l2_for"; tail -3 $OUT/tests.txt
P="python3 benchmarks/fused_prefetch.py --set attention"
step q768 45 $P --only 0,2,4 model=qwen3-0.6b bs=1 context_len=768 cache_len=1024; show q768
step l2048 50 $P --only 0,1,2 model=llama-3.2-1b bs=1 context_len=2048 cache_len=2304; show l2048
step m512 40 $P --only 0,1 model=qwen3-1.7b bs=1 context_len=512 cache_len=768; show m512
step runs 35 python3 -m harness -m mode=fused model=llama-3.2-1b bs=1 context_len=1024 cache_len=1280; grep -E "FINISHED|FAILED|sweep wall|fused_plan" $OUT/runs.txt | cut -c1-160 | tail -3
step q4b 70 $P --only 0,1 model=qwen3-4b bs=1 context_len=1024 cache_len=1280; show q4b
step q8b 80 $P --only 0,1 model=qwen3-8b bs=1 context_len=1024 cache_len=1280; show q8b
step l8b 80 $P --only 0,1 model=llama-3.1-8b bs=1 context_len=1024 cache_len=1280; show l8b
echo "total $(( $(date +%s) - device_start_s ))s"
