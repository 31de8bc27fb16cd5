bash gpu/width.sh; bash gpu/targets.sh
#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
{ date -u; nvidia-smi -L; python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; } > $OUT/machine-b.txt 2>&1
cat $OUT/machine-b.txt
for a in "model=qwen3-4b bs=1 context_len=32" "model=qwen3-4b bs=8 context_len=32" "model=qwen3-1.7b bs=1 context_len=32 --only 0,1"; do
  set -- $a; only=""; [ "${4:-}" = --only ] && only="--only $5"
  t0=$(date +%s)
  python3 benchmarks/fused_prefetch.py --set width $only $1 $2 $3 > /tmp/w.txt 2>&1
  echo "$a: rc=$? $(( $(date +%s)-t0 ))s"; cat /tmp/w.txt >> $OUT/width.txt; grep -E "^\||not built|Error|fused" /tmp/w.txt | tail -8
done
#!/usr/bin/env bash
# the two missed targets verified again, and the design card, on this lease
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
{ date -u; nvidia-smi -L; python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; } > $OUT/machine2.txt 2>&1
cat $OUT/machine2.txt
t0=$(date +%s)
python3 -m harness -m model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127 mode=fused > $OUT/llama.log 2>&1; echo "llama rc=$? $(( $(date +%s)-t0 ))s"
python3 -m harness -m model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280 mode=fused > $OUT/qwen.log 2>&1; echo "qwen rc=$? $(( $(date +%s)-t0 ))s"
grep -v '^\[harness\]' $OUT/llama.log | tail -12; grep -v '^\[harness\]' $OUT/qwen.log | tail -12
t1=$(date +%s)
python3 -m harness -m +experiment=design-card > $OUT/design-card.log 2>&1; echo "design-card rc=$? $(( $(date +%s)-t1 ))s"
grep -v '^\[harness\]' $OUT/design-card.log | tail -25
tar czf $OUT/outputs.tgz outputs mlruns 2>/dev/null; ls -la $OUT
