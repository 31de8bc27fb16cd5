#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
start=$(date +%s); left() { echo $(( ${BUDGET:-575} - ($(date +%s) - start) )); }
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv; python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
step() { name=$1; need=$2; shift 2; if [ $(left) -lt $need ]; then echo "SKIP $name ($(left)s left)"; return 1; fi
  t0=$(date +%s); timeout $(( $(left) - 5 )) "$@" >> $OUT/$name.txt 2>&1; rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s"; grep -E "^\||not built|Error|verifying|FINISHED|FAILED|µs" $OUT/$name.txt | grep -v "━" | tail -14; }
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127"
Q="model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280"
step chain 45 python3 benchmarks/persistent_chain.py
for s in big_tma study; do
  step $s-llama 80 python3 benchmarks/fused_prefetch.py --set $s $L
  step $s-qwen 80 python3 benchmarks/fused_prefetch.py --set $s $Q
done
for s in big_tma study; do for m in llama qwen; do
  [ -s $OUT/$s-$m.txt ] || continue
  i=$(python3 gpu/best.py $s $OUT/$s-$m.txt 2>/dev/null); [ -n "$i" ] || continue
  args=$L; [ $m = qwen ] && args=$Q
  step verify 40 python3 benchmarks/fused_prefetch.py --set $s --verify $i $args
done; done
tar czf $OUT/outputs.tgz outputs mlruns 2>/dev/null; ls $OUT; echo "total $(( $(date +%s) - start ))s"
