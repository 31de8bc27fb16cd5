#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
start=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - start) )); }
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv; python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
step() { name=$1; need=$2; shift 2; if [ $(left) -lt $need ]; then echo "SKIP $name ($(left)s left)"; return 1; fi
  echo "== $*" >> $OUT/$name.txt; t0=$(date +%s); timeout $(( $(left) - 5 )) "$@" >> $OUT/$name.txt 2>&1; rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s"; }
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384"
step equiv 60 python3 gpu/equiv_gpu.py $L
step equiv 40 python3 gpu/equiv_gpu.py model=qwen3-0.6b bs=8 context_len=1024 cache_len=1280
step equiv 40 python3 gpu/equiv_gpu.py model=qwen3-4b bs=1 context_len=32
cat $OUT/equiv.txt | grep -v "^=="
step suite 200 python3 -m pytest -v -m gpu tests/test_gpu.py -p no:cacheprovider
grep -E "passed|failed|PASSED|FAILED|ERROR" $OUT/suite.txt | tail -70 | cut -c1-160
echo "total $(( $(date +%s) - start ))s"
