#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv; python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
t0=$(date +%s)
timeout 575 python3 -m pytest -q -rs -m gpu -p no:cacheprovider --durations=15 tests/test_gpu.py > $OUT/tests.txt 2>&1
echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "passed|failed|FAILED|ERROR" $OUT/tests.txt | tail -15
