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
P="python3 benchmarks/fused_prefetch.py --set persistent"
step gputest 150 python3 -m pytest -q -m gpu tests/test_gpu.py -k persistent_block -x
tail -5 $OUT/gputest.txt
step pairs 90 $P $L
grep -E "^\||rounds|not built|Error|rror" $OUT/pairs.txt | grep -v "^|---" | cut -c1-80,190- | tail -8
step pairsq 90 $P $Q
grep -E "^\||rounds|not built|Error|rror" $OUT/pairsq.txt | grep -v "^|---" | cut -c1-80,190- | tail -8


step pairs17 80 $P --only 0,1,3,4 model=qwen3-1.7b bs=1 context_len=32
grep -E "^\||rounds|not built|Error" $OUT/pairs17.txt | grep -v "^|---" | cut -c1-80,190- | tail -4
step profile 45 python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from harness.kernels import fused_decode as f; f.BLOCK_MAX_ROWS = 8; import fused_kernels; fused_kernels.main(sys.argv[1:])" $L fused.pdl=false
tail -14 $OUT/profile.txt
step profile0 45 python3 benchmarks/fused_kernels.py $L fused.pdl=false
tail -14 $OUT/profile0.txt
python3 - <<'PY' > $OUT/results.txt 2>&1
import json, glob
for f in sorted(glob.glob('outputs/**/result.json', recursive=True)):
    r = json.load(open(f)); t = r.get('mode_tags', {}); m = r.get('metrics', {})
    print(r['label'], r.get('status'), {k: m.get(k) for k in ('step_ms_median', 'floor_ms', 'efficiency', 'kernel_launches_per_step', 'kl_nats', 'eager_kl_nats')}, t.get('fused_plan', '')[:400])
PY
cat $OUT/results.txt
tar czf $OUT/outputs.tgz outputs mlruns 2>/dev/null; ls $OUT; echo "total $(( $(date +%s) - start ))s"
