#!/usr/bin/env bash
# Qwen3-0.6B: gate/up's 32-column blocks with QKV's splits, warps, stages; at context 32 and at bs=8; the 8B on 4 warps
BUDGET=${BUDGET:-560}; source benchmarks/device_steps.sh
Q="model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280"
step q06 60 python3 benchmarks/fused_prefetch.py --set copies_first_reach --only 0,2,13,14,15,16 $Q
grep "^|" $OUT/q06.txt | cut -d'|' -f2,4-
step q06c32 40 python3 benchmarks/fused_prefetch.py --set copies_first_reach --only 0,2,13 model=qwen3-0.6b bs=1 context_len=32
grep "^|" $OUT/q06c32.txt | cut -d'|' -f2,4-
step q06b8 60 python3 benchmarks/fused_prefetch.py --set copies_first_reach --only 0,2,13 model=qwen3-0.6b bs=8 context_len=16384
grep "^|" $OUT/q06b8.txt | cut -d'|' -f2,4-
step verify 30 python3 benchmarks/fused_prefetch.py --set copies_first_reach --verify 13 $Q
grep -E "FINISHED|FAILED|│ 0 │" $OUT/verify.txt | cut -c1-190
step q8 90 python3 benchmarks/fused_prefetch.py --set copies_first_reach --only 0,10,11 model=qwen3-8b bs=1
grep "^|" $OUT/q8.txt | cut -d'|' -f2,4-
echo "total $(( $(date +%s) - device_start_s ))s"
