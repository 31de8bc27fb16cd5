#!/usr/bin/env bash
# The study's scope, first measured: one replay of 127 steps with the greedy kernel inside (graph_steps=127) against
# one step a replay (graph_steps=1), both verified; the new fused GPU tests; then the sweeps again (a second round)
BUDGET=${BUDGET:-420}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
Q="model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280 decode_tokens=127"
S="mode=fused graph_steps=1,127 stop=repeats repeats=16"
round() {
  step study 40 python3 -m harness -m $S $L hydra.sweep.dir=/tmp/sweeps/study-llama-$1
  step study 40 python3 -m harness -m $S $Q hydra.sweep.dir=/tmp/sweeps/study-qwen-$1
  grep -E "│ [0-9] │|sweep wall" $OUT/study.txt | tail -6 | cut -c1-220
}
round 1
step gtest 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "greedy or fused_kernels_captured or fault_inside_a_captured"
tail -3 $OUT/gtest.txt; grep -E "^FAILED|Error" $OUT/gtest.txt | head -8
round 2
tar czf $OUT/sweeps.tgz -C /tmp sweeps 2>/dev/null
echo "total $(( $(date +%s) - device_start_s ))s"
