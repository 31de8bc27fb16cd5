#!/usr/bin/env bash
# Verified jobs on the commit: the two bs=1 targets, and Qwen3-0.6B and Llama-3.2-1B at bs=1 context 16384
BUDGET=${BUDGET:-575}; source benchmarks/device_steps.sh
step targets 60 python3 -m harness -m mode=fused bs=1 model=llama-3.2-1b context_len=32 cache_len=16384 decode_tokens=127
step targets 40 python3 -m harness -m mode=fused bs=1 model=qwen3-0.6b context_len=1024 cache_len=1280
step long 90 python3 -m harness -m mode=fused bs=1 model=qwen3-0.6b,llama-3.2-1b context_len=16384 cache_len=16640
grep -E "│ [0-9] │|sweep wall" $OUT/targets.txt $OUT/long.txt | cut -c1-190
echo "total $(( $(date +%s) - device_start_s ))s"
