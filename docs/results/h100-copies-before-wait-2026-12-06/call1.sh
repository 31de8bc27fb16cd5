#!/usr/bin/env bash
# The large products' copies before the PDL wait (Gluon), checked, paired and verified; where a PDL step's time goes
BUDGET=${BUDGET:-575}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
step gtest 90 python3 -m pytest -q -m gpu tests/test_gpu.py -k "copying_before or large_products"
tail -2 $OUT/gtest.txt
step pairs 120 python3 benchmarks/fused_prefetch.py --set copies_first $L
grep "^|" $OUT/pairs.txt
step verify 50 python3 benchmarks/fused_prefetch.py --set copies_first --verify 1 $L
step q17 80 python3 benchmarks/fused_prefetch.py --set copies_first --only 0,1 model=qwen3-1.7b bs=1 context_len=32
step lpdl 45 python3 benchmarks/fused_kernels.py $L
step lfirst 45 python3 benchmarks/fused_kernels.py --variant copies_first:1 $L
for f in gtest verify q17 lpdl lfirst; do echo "### $f"; grep -v "^==\|Warning\|warn(" $OUT/$f.txt | grep -v "^\s*$" | tail -16 | cut -c1-260; done
echo "total $(( $(date +%s) - device_start_s ))s"
