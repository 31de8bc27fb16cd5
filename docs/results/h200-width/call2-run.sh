#!/usr/bin/env bash
# the GPU tests, as many as fit; $1: extra pytest args (e.g. --deselect list file)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv; python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
timeout ${LIMIT:-550} python3 -m pytest -v -rs -m gpu -p no:cacheprovider --durations=15 tests/test_gpu.py "$@" > $OUT/tests.log 2>&1
echo "rc=$?" >> $OUT/tests.log
grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/tests.log | sed 's/ *\[.*%\]//' | awk '{print $NF, $1}' | sort | uniq -c | sort -rn | head -3
grep -cE " PASSED" $OUT/tests.log; grep -E "FAILED|ERROR" $OUT/tests.log | head -20; tail -25 $OUT/tests.log
