#!/usr/bin/env bash
# On an H200 only (an H100 exits at once): the study's scope, Llama-3.2-1B's graph of 127 steps against one step a
# replay (verified jobs), and the study's window paired (benchmarks/fused_prefetch.py --set study_window)
nvidia-smi -L | grep -q H200 || { nvidia-smi -L; echo "not an H200: nothing run"; exit 0; }
BUDGET=${BUDGET:-200}; source benchmarks/device_steps.sh
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
step study 40 python3 -m harness -m mode=fused graph_steps=1,127 stop=repeats repeats=16 $L hydra.sweep.dir=/tmp/sweeps/study-llama
step window 60 python3 benchmarks/fused_prefetch.py --set study_window $L
step study 40 python3 -m harness -m mode=fused graph_steps=1,127 stop=repeats repeats=16 $L hydra.sweep.dir=/tmp/sweeps/study-llama-2
grep -E "│ [0-9] │|sweep wall|failed" $OUT/study.txt | cut -c1-240; grep -E "^\||rounds" $OUT/window.txt
tar czf $OUT/sweeps.tgz -C /tmp sweeps 2>/dev/null
echo "total $(( $(date +%s) - device_start_s ))s"
