#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
start=$(date +%s); left() { echo $(( ${BUDGET:-170} - ($(date +%s) - start) )); }
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv; python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
step() { name=$1; need=$2; shift 2; if [ $(left) -lt $need ]; then echo "SKIP $name ($(left)s left)"; return 1; fi
  echo "== $*" >> $OUT/$name.txt; t0=$(date +%s); timeout $(( $(left) - 5 )) "$@" >> $OUT/$name.txt 2>&1; rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s"; }
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
P="python3 benchmarks/fused_prefetch.py --set qkv_splits"
step pairs 40 $P --only 0,1 model=qwen3-1.7b bs=1 context_len=32
step pairs 40 $P --only 0,1 $L
grep -E "^\||rounds|not built|Error" $OUT/pairs.txt | grep -v "^|---" | cut -c1-70,190-
step targets 30 python3 -m harness -m mode=fused $L
step targets 25 python3 -m harness -m mode=fused model=qwen3-1.7b bs=1 context_len=32
grep -E "│ [0-9]|sweep wall|Error" $OUT/targets.txt
step pairs 40 $P --only 1,2 model=qwen3-1.7b bs=8 context_len=32
grep -E "^\||rounds" $OUT/pairs.txt | grep -v "^|---" | tail -3 | cut -c1-70,190-
python3 - <<'PY' > $OUT/results.txt 2>&1
import json, glob
for f in sorted(glob.glob('outputs/**/result.json', recursive=True)):
    r = json.load(open(f)); t = r.get('mode_tags', {}); m = r.get('metrics', {})
    print(r['label'], r.get('status'), {k: m.get(k) for k in ('step_ms_median', 'floor_ms', 'efficiency', 'kernel_launches_per_step', 'kl_nats', 'eager_kl_nats')}, t.get('fused_plan', '')[:330])
PY
cat $OUT/results.txt
tar czf $OUT/outputs.tgz outputs mlruns 2>/dev/null; ls $OUT; echo "total $(( $(date +%s) - start ))s"
