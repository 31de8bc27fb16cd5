#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
start=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - start) )); }
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv; python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
step() { name=$1; need=$2; shift 2; if [ $(left) -lt $need ]; then echo "SKIP $name ($(left)s left)"; return 1; fi
  echo "== $*" >> $OUT/$name.txt; t0=$(date +%s); timeout $(( $(left) - 5 )) "$@" >> $OUT/$name.txt 2>&1; rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s"; }
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
Q="model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280"
P="python3 benchmarks/fused_prefetch.py --set waits"
step blocktest 120 python3 -m pytest -q -m gpu tests/test_gpu.py -k persistent_block -p no:cacheprovider
tail -3 $OUT/blocktest.txt
step phases 60 python3 benchmarks/block_phases.py --set waits 2 $L
step phases 60 python3 benchmarks/block_phases.py --set waits 1 $L
grep -v -i warn $OUT/phases.txt
step pairs 100 $P $L
grep -E "^\||rounds|Error|rror" $OUT/pairs.txt | grep -v "^|---" | sed 's/| pdl=on[^|]*|/|/' | tail -6
step pairsq 80 $P --only 0,1,2 $Q
grep -E "^\||rounds|Error|rror" $OUT/pairsq.txt | grep -v "^|---" | sed 's/| pdl=on[^|]*|/|/' | tail -5
step suite6 150 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -k "tuned_fused or fault_inside_a_captured or whole_against_regional or every_backend_but_eager or loaded_from_disk"
tail -5 $OUT/suite6.txt
ls $OUT; echo "total $(( $(date +%s) - start ))s"
