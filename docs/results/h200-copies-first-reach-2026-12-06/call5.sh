#!/usr/bin/env bash
# The same H200, 23:33 UTC: where Llama-3.2-1B's step goes (run as one command line of the device call)
BUDGET=60; source benchmarks/device_steps.sh >/dev/null
step lprofile 30 python3 benchmarks/fused_kernels.py model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127
tail -10 $OUT/lprofile.txt
