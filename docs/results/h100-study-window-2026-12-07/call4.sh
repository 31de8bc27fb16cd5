#!/usr/bin/env bash
# The whole GPU suite on the code as committed (the capture's warm-up fix, one attention chunk up to 384 slots at bs=1
# for heads of 64), on whatever GPU the call got
BUDGET=${BUDGET:-470}; source benchmarks/device_steps.sh
step gsuite 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_gpu.py
tail -4 $OUT/gsuite.txt; grep -E "^FAILED|^ERROR" $OUT/gsuite.txt | head -10
echo "total $(( $(date +%s) - device_start_s ))s"
