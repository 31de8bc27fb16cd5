python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
{ date -u; nvidia-smi -L; } | tee $OUT/machine-c.txt
t0=$(date +%s)
python3 -m harness -m model=qwen3-4b bs=1,8,32 context_len=32 mode=fused > $OUT/q4b.log 2>&1; echo "4b rc=$? $(( $(date +%s)-t0 ))s"
grep -v '^\[harness\]' $OUT/q4b.log | grep -v "^WARN" | tail -12
python3 -c "
import json,glob
for f in sorted(glob.glob('outputs/sweeps/*/*/*/result.json'))+sorted(glob.glob('outputs/sweeps/*/*/*/*/result.json')):
    r=json.load(open(f)); t=r.get('tags',{}); m=r.get('metrics',{})
    print(f, m.get('median_ms'), m.get('floor_ms'), m.get('kernels_per_step'), m.get('kl_nats_per_token'), t.get('fused_plan','')[:400])
" 2>&1 | tail -6
tar czf $OUT/q4b.tgz outputs mlruns 2>/dev/null
timeout 300 python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_gpu.py -k "idle_gaps or tma or ab_of_whole or loaded_from_disk" > $OUT/tests-c.log 2>&1; echo "tests rc=$?"
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/tests-c.log | tail -12
