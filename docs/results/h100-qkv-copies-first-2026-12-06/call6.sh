#!/usr/bin/env bash
# The new rule against the rules before, paired, at longer contexts (Llama-3.2-1B at 2048, Qwen3-1.7B at 1024)
BUDGET=${BUDGET:-200}; source benchmarks/device_steps.sh
step l2k 40 python3 benchmarks/fused_prefetch.py --set qkv_o_first --only 0,13 model=llama-3.2-1b bs=1 context_len=2048 cache_len=2304
grep "^|" $OUT/l2k.txt | cut -d'|' -f2,4-
step q1k 40 python3 benchmarks/fused_prefetch.py --set qkv_o_first --only 0,13 model=qwen3-1.7b bs=1 context_len=1024 cache_len=1280
grep "^|" $OUT/q1k.txt | cut -d'|' -f2,4-
echo "total $(( $(date +%s) - device_start_s ))s"
