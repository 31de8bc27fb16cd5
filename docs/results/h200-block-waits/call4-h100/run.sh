#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
start=$(date +%s); left() { echo $(( ${BUDGET:-330} - ($(date +%s) - start) )); }
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv; python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
step() { name=$1; need=$2; shift 2; if [ $(left) -lt $need ]; then echo "SKIP $name ($(left)s left)"; return 1; fi
  echo "== $*" >> $OUT/$name.txt; t0=$(date +%s); timeout $(( $(left) - 5 )) "$@" >> $OUT/$name.txt 2>&1; rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s"; }
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
step blocktest 120 python3 -m pytest -q -m gpu tests/test_gpu.py -k "persistent_block or attention_in_qkvs_tail" -p no:cacheprovider
tail -3 $OUT/blocktest.txt
step pairs 60 python3 benchmarks/fused_prefetch.py --set waits --only 0,1,2 model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127
grep -E "^\||rounds|Error|rror" $OUT/pairs.txt | grep -v "^|---" | sed 's/| pdl=on[^|]*|/|/' | tail -4
ls $OUT; echo "total $(( $(date +%s) - start ))s"
