#!/usr/bin/env bash
# The targets on HEAD; the copies-first rule where it does not reach (1024 and 4096 wide), on 4 warps, O's launch point
BUDGET=${BUDGET:-570}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
Q="model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280"
step targets 40 python3 -m harness -m mode=fused $L
step targets 40 python3 -m harness -m mode=fused $Q
grep -E "│ [0-9] │|sweep wall" $OUT/targets.txt | cut -c1-190
step q06 90 python3 benchmarks/fused_prefetch.py --set copies_first_reach --only 0,1,2,3,4,5,6 $Q
grep "^|" $OUT/q06.txt | cut -d'|' -f2,4-
step llama 60 python3 benchmarks/fused_prefetch.py --set copies_first_reach --only 0,7,8 $L
grep "^|" $OUT/llama.txt | cut -d'|' -f2,4-
step q17 60 python3 benchmarks/fused_prefetch.py --set copies_first_reach --only 0,7,8 model=qwen3-1.7b bs=1 context_len=32
grep "^|" $OUT/q17.txt | cut -d'|' -f2,4-
step q8 120 python3 benchmarks/fused_prefetch.py --set copies_first_reach --only 0,9,12 model=qwen3-8b bs=1
grep "^|" $OUT/q8.txt | cut -d'|' -f2,4-
echo "total $(( $(date +%s) - device_start_s ))s"
