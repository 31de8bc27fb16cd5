#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
start=$(date +%s); left() { echo $(( ${BUDGET:-500} - ($(date +%s) - start) )); }
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv; python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
step() { name=$1; need=$2; shift 2; if [ $(left) -lt $need ]; then echo "SKIP $name ($(left)s left)"; return 1; fi
  echo "== $*" >> $OUT/$name.txt; t0=$(date +%s); timeout $(( $(left) - 5 )) "$@" >> $OUT/$name.txt 2>&1; rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s"; }
cp gpu/commit.txt $OUT/commit.txt
step suite 440 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider
tail -8 $OUT/suite.txt
ls $OUT; echo "total $(( $(date +%s) - start ))s"
