#!/usr/bin/env bash
# The new rule (QKV copied first on 2 stages, the large products on 2): the fused GPU tests, the targets, and the
# rule against the rules before (QKV through registers, large products on 3 stages) paired
BUDGET=${BUDGET:-250}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
step targets 30 python3 -m harness -m mode=fused $L
step targets 30 python3 -m harness -m mode=fused bs=1 model=qwen3-1.7b context_len=32
grep -E "│ [0-9] │|sweep wall" $OUT/targets.txt | cut -c1-190
step gtest 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "fused or copying_before or large_products"
tail -3 $OUT/gtest.txt
echo "total $(( $(date +%s) - device_start_s ))s"
