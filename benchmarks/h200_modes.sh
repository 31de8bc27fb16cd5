#!/usr/bin/env bash
# Issue 3's evidence on the H200: GPU tests, then every mode across batch sizes at cache_len 1024,
# then the fastest bs=1 combinations. Logs go to ${OUT:-.}/; each step is time-boxed.
set -u
out=${OUT:-.}
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log" | tail -8
timeout 170 python3 -m harness -m bs=1,2,4,8,16,32 mode=eager,graphed,bucketed cache_len=1024 \
  > "$out/sweep_graphs.log" 2>&1; tail -28 "$out/sweep_graphs.log"
timeout 200 python3 -m harness -m bs=1,8 mode=compiled-nograph,compiled cache_len=1024 \
  > "$out/sweep_compiled.log" 2>&1; tail -10 "$out/sweep_compiled.log"
timeout 150 python3 -m harness -m bs=1 cache_len=1024 mode=graphed,compiled graph_steps=1 model.fuse_projections=true \
  > "$out/fastest.log" 2>&1; tail -8 "$out/fastest.log"
timeout 40 python3 -m harness -m bs=1 cache_len=1024 mode=graphed graph_steps=4 model.fuse_projections=false,true \
  > "$out/steps4.log" 2>&1; tail -8 "$out/steps4.log"
tar czf "$out/outputs.tgz" outputs
