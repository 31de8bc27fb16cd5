#!/usr/bin/env bash
# Commit 47a585f (the three launches' chunks aimed at 128 programs): the whole GPU suite, then the two bs=1 targets
BUDGET=${BUDGET:-570}; source benchmarks/device_steps.sh
step suite 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py; tail -2 $OUT/suite.txt; grep -E "FAILED|Error" $OUT/suite.txt | head -5
step targets 60 python3 -m harness -m mode=fused bs=1 model=llama-3.2-1b context_len=32 cache_len=16384 decode_tokens=127; step targets 40 python3 -m harness -m mode=fused bs=1 model=qwen3-0.6b context_len=1024 cache_len=1280
grep -E "│ [0-9] │|sweep wall" $OUT/targets.txt | cut -c1-170
echo "total $(( $(date +%s) - device_start_s ))s"
