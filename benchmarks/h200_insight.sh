#!/usr/bin/env bash
# Issues 3-5 on the H200 in one lease: GPU tests, the speed-of-light/attribution sweep (issue 4),
# a real OOM in a sweep (issue 5), and the bucket set across batch sizes (issue 3). Logs to ${OUT:-.}/.
set -u
out=${OUT:-.}
export PYTHONUNBUFFERED=1 HARNESS_CACHE=$PWD/.harness-cache
sweep() {  # name, time limit, overrides...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m harness -m "$@" > "$out/$name.log" 2>&1; grep -A40 "^sweep " "$out/$name.log" | grep -v "^\[harness\]" | cut -c1-170
}
timeout 120 python3 -m pytest -q -s -m gpu -p no:cacheprovider -k "not compiled" tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log" | grep -E "kernels/step|set .* MiB|passed|failed|Error"
sweep sweep_insight 120 bs=1,8 cache_len=256,4096 mode=eager,graphed profile=true
sweep sweep_oom 60 bs=8,4096 cache_len=32768 mode=graphed
sweep sweep_buckets 90 bs=1,2,4,8,16,32 mode=bucketed cache_len=1024
cat .harness-cache/ceilings.json
tar czf "$out/outputs.tgz" outputs
