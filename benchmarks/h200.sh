#!/usr/bin/env bash
# On the H200 (the `device` tool, which reaches no package index): install the wheelhouse carried in .whl/,
# then run the GPU tests and named sweeps (conf/experiment/*.yaml). Logs and outputs.tgz go to $OUT.
#   bash benchmarks/h200.sh [tests] PRESET...        e.g.  bash benchmarks/h200.sh tests design-card
# A shell is needed only for the wheelhouse; each sweep is `python -m harness -m +experiment=PRESET`.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
out=${OUT:-.}
for step in "$@"; do
  if [ "$step" = tests ]; then
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log" | tail -5
  else
    python3 -m harness -m "+experiment=$step" > "$out/$step.log" 2>&1
    grep -v '^\[harness\]' "$out/$step.log" | tail -40
  fi
done
tar czf "$out/outputs.tgz" outputs mlruns
