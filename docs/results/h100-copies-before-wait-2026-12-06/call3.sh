#!/usr/bin/env bash
# The copies before the PDL wait on 3 stages, with O letting gate/up launch at its wait or start, paired on both
# models the rule covers; the GPU tests of the large products
BUDGET=${BUDGET:-190}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
step pairs 40 python3 benchmarks/fused_prefetch.py --set copies_first --only 0,2,5,6,7 $L
grep "^|" $OUT/pairs.txt | cut -d'|' -f2,4-
step q17 40 python3 benchmarks/fused_prefetch.py --set copies_first --only 0,2,5,6,7 model=qwen3-1.7b bs=1 context_len=32
grep "^|" $OUT/q17.txt | cut -d'|' -f2,4-
step verify 30 python3 benchmarks/fused_prefetch.py --set copies_first --verify 6 $L
grep "FINISHED\|FAILED\|│ 0" $OUT/verify.txt | cut -c1-200
echo "total $(( $(date +%s) - device_start_s ))s"
