#!/usr/bin/env bash
# After the fix (down read a gain it has none of): the copies before the PDL wait checked, paired (O letting gate/up
# launch after its loop, at its wait, at its start) and verified; where each PDL step's time goes
BUDGET=${BUDGET:-300}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
step gtest 80 python3 -m pytest -q -m gpu tests/test_gpu.py -k "copying_before or large_products"
tail -2 $OUT/gtest.txt
step pairs 120 python3 benchmarks/fused_prefetch.py --set copies_first $L
grep "^|" $OUT/pairs.txt | cut -d'|' -f2,4-
step verify 50 python3 benchmarks/fused_prefetch.py --set copies_first --verify 1 $L
grep "FINISHED\|FAILED\|│ 0" $OUT/verify.txt | cut -c1-200
step q17 80 python3 benchmarks/fused_prefetch.py --set copies_first --only 0,1,2,3 model=qwen3-1.7b bs=1 context_len=32
grep "^|" $OUT/q17.txt | cut -d'|' -f2,4-

step lstart 40 python3 benchmarks/fused_kernels.py --variant copies_first:3 $L
for f in lstart; do echo "### $f"; grep -A9 "µs a step" $OUT/$f.txt | cut -c1-250; done
echo "total $(( $(date +%s) - device_start_s ))s"
