#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
start=$(date +%s); left() { echo $(( ${BUDGET:-230} - ($(date +%s) - start) )); }
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv; python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; git log --oneline -1; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
step() { name=$1; need=$2; shift 2; if [ $(left) -lt $need ]; then echo "SKIP $name ($(left)s left)"; return 1; fi
  echo "== $*" >> $OUT/$name.txt; t0=$(date +%s); timeout $(( $(left) - 5 )) "$@" >> $OUT/$name.txt 2>&1; rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s"; }
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
P="python3 benchmarks/fused_prefetch.py --set big_tma"
step pairs 40 $P --only 0,8 model=qwen3-1.7b bs=1 context_len=32
step pairs 40 python3 benchmarks/fused_prefetch.py --set large_stages --only 0,6 model=llama-3.2-1b bs=8 context_len=32
step pairs 45 python3 benchmarks/fused_prefetch.py --set large_stages $L
grep -E "^\||rounds|not built|Error" $OUT/pairs.txt | grep -v "^|---" | cut -c1-60,170-
step verify 25 python3 -m harness -m +experiment=ladder mode=fused model=llama-3.2-1b bs=1
grep -E "│ [0-9]|sweep wall|Error" $OUT/verify.txt
step tests 35 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/test_gpu.py -k "large_products"
tail -3 $OUT/tests.txt
step pairs 40 python3 benchmarks/fused_prefetch.py --set large_stages --only 0,6 model=llama-3.2-1b bs=32 context_len=32
grep -E "^\||rounds" $OUT/pairs.txt | grep -v "^|---" | tail -3 | cut -c1-60,170-
step verify 25 python3 -m harness -m model=qwen3-1.7b bs=1 context_len=32 mode=fused
step profile 40 python3 benchmarks/fused_kernels.py $L fused.pdl=false
tail -30 $OUT/profile.txt
python3 - <<'PY' > $OUT/results.txt 2>&1
import json, glob
for f in sorted(glob.glob('outputs/**/result.json', recursive=True)):
    r = json.load(open(f)); t = r.get('mode_tags', {}); m = r.get('metrics', {})
    print(r['label'], r.get('status'), {k: m.get(k) for k in ('step_ms_median', 'floor_ms', 'efficiency', 'kernel_launches_per_step', 'kl_nats', 'eager_kl_nats')}, t.get('fused_plan', '')[:330])
PY
cat $OUT/results.txt
tar czf $OUT/outputs.tgz outputs mlruns 2>/dev/null; ls $OUT; echo "total $(( $(date +%s) - start ))s"
