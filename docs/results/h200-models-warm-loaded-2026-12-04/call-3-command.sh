python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
nvidia-smi --query-gpu=uuid,driver_version --format=csv,noheader; date -u; ls /tmp/harness-cache/compile/steps | wc -l
s=$(date +%s); timeout 420 python3 -m harness -m +experiment=models > $OUT/models-warm.log 2>&1; echo "rc=$? $(( $(date +%s)-s )) s"
grep -v '^\[harness\]' $OUT/models-warm.log | tail -4
tar czf $OUT/warm.tgz outputs mlruns; ls -la $OUT
