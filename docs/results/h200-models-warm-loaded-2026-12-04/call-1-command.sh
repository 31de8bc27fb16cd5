python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
nvidia-smi --query-gpu=uuid,driver_version --format=csv,noheader; date -u
s=$(date +%s); python3 -m harness -m +experiment=models mode=compiled model=llama-3.2-1b,qwen3-0.6b,qwen3-1.7b,qwen3-8b > $OUT/models-cold-a.log 2>&1; echo "rc=$? $(( $(date +%s)-s )) s"
grep -v '^\[harness\]' $OUT/models-cold-a.log | tail -14
ls /tmp/harness-cache/compile/steps > /tmp/before.txt
W="bs=1 context_len=1024 model.fuse_projections=true mode=compiled attn=triton-decode compile_mode=max-autotune decode_tokens=1024"
s=$(date +%s); timeout 230 python3 -m harness ab "+inductor.triton.enable_pdl=false" "+inductor.triton.enable_pdl=true" $W --pairs 24 --out $OUT/ab > $OUT/ab.log 2>&1; echo "ab rc=$? $(( $(date +%s)-s )) s"; tail -25 $OUT/ab.log
mkdir -p /tmp/pdl && for f in $(ls /tmp/harness-cache/compile/steps | grep -vxFf /tmp/before.txt); do cp /tmp/harness-cache/compile/steps/$f /tmp/pdl/; done; ls -la /tmp/pdl
tar czf $OUT/pdl-steps.tgz -C /tmp pdl; tar czf $OUT/cold-a.tgz outputs mlruns; ls -la $OUT
