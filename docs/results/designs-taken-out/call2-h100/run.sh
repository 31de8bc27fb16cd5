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
step pairs 90 python3 gpu/pair_old.py $L
step pairs 90 python3 gpu/pair_old.py $Q
grep -E "^\||rounds|Error|rror" $OUT/pairs.txt | grep -v "^|---" | sed 's/| pdl=on[^|]*|/|/'
if [ -s gpu/rest.txt ]; then step rest 60 python3 -m pytest -v -m gpu -p no:cacheprovider $(cat gpu/rest.txt); grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/rest.txt | cut -c1-160; fi
step targets 60 python3 -m harness -m mode=fused $L
step targets 60 python3 -m harness -m mode=fused $Q
grep -iE "verified|ms/step|FINISHED|FAILED|fail" $OUT/targets.txt | tail -12 | cut -c1-200
ls multirun 2>/dev/null | tail -2; d=$(ls -d multirun/*/* 2>/dev/null | tail -2); [ -n "$d" ] && tar czf $OUT/targets.tgz $d
echo "total $(( $(date +%s) - start ))s"
