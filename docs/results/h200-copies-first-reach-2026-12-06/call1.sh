#!/usr/bin/env bash
# The copies-first rule as committed (ec5c669): the targets verified against fp32, the 8B models, the pairs where the
# rule was not measured (Qwen3-4B, Llama-3.1-8B), then the fused GPU tests
BUDGET=${BUDGET:-575}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
Q="model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280"
step targets 40 python3 -m harness -m mode=fused $Q
step targets 40 python3 -m harness -m mode=fused $L
grep -E "│ [0-9] │|sweep wall" $OUT/targets.txt | cut -c1-200
step big 80 python3 -m harness -m mode=fused model=qwen3-8b,llama-3.1-8b bs=1
grep -E "│ [0-9] │|sweep wall" $OUT/big.txt | cut -c1-200
step q4 70 python3 benchmarks/fused_prefetch.py --set copies_first_reach --only 0,17 model=qwen3-4b bs=1
grep "^|" $OUT/q4.txt | cut -d'|' -f2,4-
step l8 90 python3 benchmarks/fused_prefetch.py --set copies_first_reach --only 0,17 model=llama-3.1-8b bs=1
grep "^|" $OUT/l8.txt | cut -d'|' -f2,4-
step gtest 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "fused or copying_before or large_products or tiles_through_tma"
tail -3 $OUT/gtest.txt; grep -E "^FAILED|Error" $OUT/gtest.txt | head -5
echo "total $(( $(date +%s) - device_start_s ))s"
