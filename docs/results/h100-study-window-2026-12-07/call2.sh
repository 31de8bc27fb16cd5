#!/usr/bin/env bash
# The study's scope on this GPU with one attention chunk a KV head up to 384 slots at bs=1 for heads of 64: Llama-3.2-1B's
# graph of 127 steps against one step a replay (verified jobs), the study's window paired (benchmarks/fused_prefetch.py
# --set study_window), Qwen3-0.6B's pair, the fused GPU tests
BUDGET=${BUDGET:-330}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
Q="model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280 decode_tokens=127"
S="mode=fused graph_steps=1,127 stop=repeats repeats=16"
step study 40 python3 -m harness -m $S $L hydra.sweep.dir=/tmp/sweeps/study-llama
step window 60 python3 benchmarks/fused_prefetch.py --set study_window $L
step study 40 python3 -m harness -m $S $Q hydra.sweep.dir=/tmp/sweeps/study-qwen
grep -E "│ [0-9] │|sweep wall|failed" $OUT/study.txt | cut -c1-240; grep -E "^\||rounds" $OUT/window.txt
step gtest 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "fused_kernels_captured or kept_context_in_a_cache"
tail -1 $OUT/gtest.txt
tar czf $OUT/sweeps.tgz -C /tmp sweeps 2>/dev/null
echo "total $(( $(date +%s) - device_start_s ))s"
