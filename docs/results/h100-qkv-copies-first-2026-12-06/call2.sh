#!/usr/bin/env bash
# The whole GPU suite on the tree of call 1 (the rules as committed at 305463a, the new variants off), the same machine
BUDGET=570; source benchmarks/device_steps.sh >/dev/null; step suite 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py; tail -4 $OUT/suite.txt
