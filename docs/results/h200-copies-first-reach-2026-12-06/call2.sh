#!/usr/bin/env bash
# The same H200, at once: the two bs=1 targets twice more each, then the GPU tests call 1 did not run
BUDGET=${BUDGET:-430}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
Q="model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280"
for i in 1 2; do step targets 30 python3 -m harness -m mode=fused $L; step targets 30 python3 -m harness -m mode=fused $Q; done
grep -E "│ [0-9] │|ms/step" $OUT/targets.txt | cut -c1-200
step suite 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "not (fused or copying_before or large_products or tiles_through_tma)"
tail -2 $OUT/suite.txt; grep -E "^FAILED|Error" $OUT/suite.txt | head -5
echo "total $(( $(date +%s) - device_start_s ))s"
