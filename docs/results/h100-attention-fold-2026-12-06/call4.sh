#!/usr/bin/env bash
# The fold rule on the GPU: its GPU test, a pair where no run had measured it, a verified run where it unfolds
BUDGET=${BUDGET:-190}; source benchmarks/device_steps.sh
show() { grep -E "^\||rounds|not built|Error" $OUT/pairs.txt | grep -v "^|---" | cut -c1-60,170- | tail -${1:-4}; }
step tests 40 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k three_launches; tail -3 $OUT/tests.txt
P="python3 benchmarks/fused_prefetch.py --set attention"
step pairs 70 $P --only 1,2 model=qwen3-8b bs=1 context_len=1024 cache_len=1280 && show 3
step runs 40 python3 -m harness -m mode=fused model=llama-3.2-1b bs=1 context_len=1024 cache_len=1280; grep -E "FINISHED|FAILED|sweep wall" $OUT/runs.txt | cut -c1-150
step pairs 35 $P model=qwen3-1.7b bs=1 context_len=1024 cache_len=1280 && show
echo "total $(( $(date +%s) - device_start_s ))s"
