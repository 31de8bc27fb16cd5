python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
nvidia-smi --query-gpu=uuid,driver_version --format=csv,noheader; date -u; ls /tmp/harness-cache/compile/steps | wc -l
s=$(date +%s); python3 -m harness -m +experiment=models mode=compiled model=qwen3-30b-a3b,qwen3-4b > $OUT/models-cold-b.log 2>&1; echo "rc=$? $(( $(date +%s)-s )) s"
grep -v '^\[harness\]' $OUT/models-cold-b.log | tail -4
W="bs=1 context_len=1024 model.fuse_projections=true mode=compiled attn=triton-decode compile_mode=max-autotune decode_tokens=1024"
s=$(date +%s); timeout 290 python3 -m harness ab "+inductor.triton.enable_pdl=false" "+inductor.triton.enable_pdl=true" $W --pairs 24 --out $OUT/ab > $OUT/ab.log 2>&1; echo "ab rc=$? $(( $(date +%s)-s )) s"; grep -v '\] ab: block' $OUT/ab.log | tail -30
tar czf $OUT/cold-b.tgz outputs mlruns; ls -la $OUT $OUT/ab
