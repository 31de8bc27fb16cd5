#!/usr/bin/env bash
# The GPU tests of what this change touches: every fused test, and attn=triton-decode's (its split-KV program now
# called from a function of its own), on the rule with the merge asking ahead (FOLD_MIN_KV_BYTES at 4 MiB)
BUDGET=${BUDGET:-400}; source benchmarks/device_steps.sh
step suite 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "fused or three_launches or asks_l2 or triton or tiles_through_tma or large_products"
grep -E "passed|failed|FAILED|Error" $OUT/suite.txt | tail -12
echo "total $(( $(date +%s) - device_start_s ))s"
