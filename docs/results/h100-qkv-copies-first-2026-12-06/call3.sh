#!/usr/bin/env bash
# QKV and O on fewer stages, paired on both models; the best verified
BUDGET=${BUDGET:-300}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
step pairs 60 python3 benchmarks/fused_prefetch.py --set qkv_o_first --only 0,5,8,9,10,11 $L
grep "^|" $OUT/pairs.txt | cut -d'|' -f2,4-
step q17 60 python3 benchmarks/fused_prefetch.py --set qkv_o_first --only 0,5,8,9,10,11 model=qwen3-1.7b bs=1 context_len=32
grep "^|" $OUT/q17.txt | cut -d'|' -f2,4-
step verify 30 python3 benchmarks/fused_prefetch.py --set qkv_o_first --verify 5 $L
grep "FINISHED\|FAILED\|│ 0" $OUT/verify.txt | cut -c1-200
echo "total $(( $(date +%s) - device_start_s ))s"
