#!/usr/bin/env bash
# QKV and O as the Gluon kernel, their copies before the PDL wait, and the kernel summing each tile as it reads it:
# their GPU tests, paired on both models the rule covers, one verified; then the two bs=1 targets under the rules
BUDGET=${BUDGET:-575}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
step gtest 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "copying_before"
tail -3 $OUT/gtest.txt
step pairs 100 python3 benchmarks/fused_prefetch.py --set qkv_o_first $L
grep "^|" $OUT/pairs.txt | cut -d'|' -f2,4-
step q17 100 python3 benchmarks/fused_prefetch.py --set qkv_o_first model=qwen3-1.7b bs=1 context_len=32
grep "^|" $OUT/q17.txt | cut -d'|' -f2,4-
step verify 40 python3 benchmarks/fused_prefetch.py --set qkv_o_first --verify 7 $L
grep "FINISHED\|FAILED\|│ 0" $OUT/verify.txt | cut -c1-200
step targets 40 python3 -m harness -m mode=fused $L
step targets 40 python3 -m harness -m mode=fused bs=1 model=qwen3-0.6b context_len=1024 cache_len=1280
grep -E "│ [0-9] │|sweep wall" $OUT/targets.txt | cut -c1-190
echo "total $(( $(date +%s) - device_start_s ))s"
