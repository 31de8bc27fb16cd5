#!/usr/bin/env bash
# Where the step goes under the new rule, PDL on (each kernel's share of the path), the same machine
BUDGET=150; source benchmarks/device_steps.sh >/dev/null; L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"; step lpdl 45 python3 benchmarks/fused_kernels.py $L; grep -v "^==\|Warning\|warn(" $OUT/lpdl.txt | grep -v "^\s*$" | tail -22 | cut -c1-260
