#!/usr/bin/env bash
# Issue 3's evidence on the H200: GPU tests, then every mode across batch sizes at cache_len 1024,
# then the fastest bs=1 combinations. Logs go to ${OUT:-.}/; each step is time-boxed.
#   bash benchmarks/h200_modes.sh [TEST_FILTER] [STEPS]
#   STEPS: any of tests,graphs,buckets,compiled,compiled_graphs,fastest,autotune,profiles
set -u
out=${OUT:-.}
filter=${1:-}
steps=${2:-tests,graphs,compiled,fastest,autotune}
export PYTHONUNBUFFERED=1
has() { [[ ",$steps," == *",$1,"* ]]; }
sweep() {  # name, time limit, overrides...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m harness -m "$@" > "$out/$name.log" 2>&1; grep -A40 "^sweep " "$out/$name.log" | grep -v "^\[harness\]"
}
has tests && { timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider ${filter:+-k "$filter"} tests/test_gpu.py 2>&1 \
  | tee "$out/gpu_tests.log" | tail -8; }
has graphs && sweep sweep_graphs 170 bs=1,2,4,8,16,32 mode=eager,graphed,bucketed cache_len=1024
has buckets && sweep sweep_buckets 120 bs=1,2,3,4,8,16,32,48 mode=bucketed cache_len=1024
has compiled && sweep sweep_compiled 560 bs=1,2,4,8,16,32 mode=compiled-nograph,compiled cache_len=1024
has compiled_graphs && sweep sweep_compiled_graphs 200 bs=1,2,4,8,16,32 mode=compiled cache_len=1024
has fastest && sweep fastest 150 bs=1 cache_len=1024 mode=graphed,compiled model.fuse_projections=true attn=sdpa,sdpa-gqa
has fastest && sweep steps4 40 bs=1 cache_len=1024 mode=graphed graph_steps=4 model.fuse_projections=false,true
has autotune && sweep autotune 110 bs=1 cache_len=1024 mode=compiled compile_mode=max-autotune \
  model.fuse_projections=true profile=true
# Inductor's coordinate-descent tuning of its Triton kernels' launch parameters, as gpt-fast sets it
has autotune && TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 sweep autotune_cd 200 bs=1 cache_len=1024 mode=compiled \
  compile_mode=max-autotune model.fuse_projections=true profile=true
has profiles && sweep profiles 150 bs=1 cache_len=1024 mode=compiled model.fuse_projections=true attn=sdpa,sdpa-gqa profile=true
has profiles && for f in mlruns/artifacts/*/artifacts/top_kernels.csv; do
  run=${f#mlruns/artifacts/}; cp "$f" "$out/top_kernels_${run%%/*}.csv"; done
tar czf "$out/outputs.tgz" outputs mlruns
