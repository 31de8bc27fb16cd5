#!/usr/bin/env bash
# The same H200: the ladder's fused jobs on this code (for the README's table), then Qwen3-0.6B at bs=8, context 16384
BUDGET=${BUDGET:-330}; source benchmarks/device_steps.sh
step ladder 150 python3 -m harness -m +experiment=ladder mode=fused hydra.sweep.dir=/tmp/ladder
grep -E "│ [0-9] │|sweep wall" $OUT/ladder.txt | cut -c1-200
tar czf $OUT/ladder.tgz -C /tmp ladder
step long 40 python3 -m harness -m mode=fused model=qwen3-0.6b bs=8 context_len=16384
grep -E "│ [0-9] │|sweep wall" $OUT/long.txt | cut -c1-200
echo "total $(( $(date +%s) - device_start_s ))s"
