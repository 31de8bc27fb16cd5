#!/usr/bin/env bash
# The same H200: where Qwen3-0.6B's step goes now (a target missed), then the rule against the rules before, paired
BUDGET=${BUDGET:-250}; source benchmarks/device_steps.sh
Q="model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280"
step profile 60 python3 benchmarks/fused_kernels.py $Q
tail -30 $OUT/profile.txt
step q06 60 python3 benchmarks/fused_prefetch.py --set copies_first_reach --only 0,17 $Q
grep "^|" $OUT/q06.txt | cut -d'|' -f2,4-
step llama 50 python3 benchmarks/fused_prefetch.py --set copies_first_reach --only 0,17 model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127
grep "^|" $OUT/llama.txt | cut -d'|' -f2,4-
echo "total $(( $(date +%s) - device_start_s ))s"
