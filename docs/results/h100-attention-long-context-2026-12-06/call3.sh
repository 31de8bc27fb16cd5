#!/usr/bin/env bash
# The whole GPU suite on the commit with the attention's warps and stages passed at launch
BUDGET=${BUDGET:-575}; source benchmarks/device_steps.sh
step suite 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py; tail -2 $OUT/suite.txt; grep -E "FAILED|Error" $OUT/suite.txt | head -5
echo "total $(( $(date +%s) - device_start_s ))s"
