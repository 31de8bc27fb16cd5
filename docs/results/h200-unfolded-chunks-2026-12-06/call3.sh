#!/usr/bin/env bash
# UNFOLDED_ATTENTION_PROGRAMS = 128: verified harness jobs where the rule unfolds, the GPU tests of the fused mode
BUDGET=${BUDGET:-575}; source benchmarks/device_steps.sh
step runs 120 python3 -m harness -m mode=fused bs=1 model=qwen3-0.6b,llama-3.2-1b context_len=2048 cache_len=2304; grep -E "FINISHED|FAILED|sweep wall|fused_plan|ms/step" $OUT/runs.txt | cut -c1-200 | tail -8
step tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "fused or three_launches or asks_l2 or triton or tiles_through_tma or large_products"; tail -2 $OUT/tests.txt
step q2048 40 python3 benchmarks/fused_prefetch.py --set unfolded_chunks --only 0,2 model=qwen3-0.6b bs=1 context_len=2048 cache_len=2304; grep -E "^\|" $OUT/q2048.txt | tail -2 | cut -c1-60,200-
echo "total $(( $(date +%s) - device_start_s ))s"
