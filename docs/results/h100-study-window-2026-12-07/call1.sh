#!/usr/bin/env bash
# As it ran (08:16 UTC, tree c3d525e with --set study_window added): that set's third variant then set
# ONE_CHUNK_MAX_SLOTS=512, which at this workload (plan for 286 slots) is the plan the rule of 9ca0ecc gives
# After the capture's warm-up fix (each warm-up call from one cache position): the GPU test of the sweep that failed
# and the fused tests beside it, then the study's scope on this GPU (one replay of 127 steps with the greedy kernel
# inside, graph_steps=127, against one step a replay), Llama-3.2-1B and Qwen3-0.6B, two rounds
BUDGET=${BUDGET:-540}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
Q="model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280 decode_tokens=127"
S="mode=fused graph_steps=1,127 stop=repeats repeats=16"
round() {
  step study 40 python3 -m harness -m $S $L hydra.sweep.dir=/tmp/sweeps/study-llama-$1
  step study 40 python3 -m harness -m $S $Q hydra.sweep.dir=/tmp/sweeps/study-qwen-$1
  grep -E "│ [0-9] │|sweep wall|failed" $OUT/study.txt | tail -8 | cut -c1-240
}
round 1
step gtest 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "kept_context_in_a_cache or greedy or fused_kernels_captured or fault_inside_a_captured"
tail -3 $OUT/gtest.txt; grep -E "^FAILED|Error" $OUT/gtest.txt | head -8
step window 90 python3 benchmarks/fused_prefetch.py --set study_window $L
grep -E "^\||rounds" $OUT/window.txt
step window 50 python3 benchmarks/fused_prefetch.py --set study_window --verify 2 $L hydra.sweep.dir=/tmp/sweeps/window-verify
grep -E "│ [0-9] │|sweep wall|failed" $OUT/window.txt | tail -3 | cut -c1-240
round 2
tar czf $OUT/sweeps.tgz -C /tmp sweeps 2>/dev/null
echo "total $(( $(date +%s) - device_start_s ))s"
