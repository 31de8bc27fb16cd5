#!/usr/bin/env bash
# call 1 ran on commit 3212910 (the --variant option), on an H100; call 2 on 7fd654e (UNFOLDED_ATTENTION_PROGRAMS at 264), on an H200;
# call 3 on the same H200, 7fd654e with it at 128 as committed next
# The GPU tests of the merge_one_head refactor (8b3c184); why the fold wins at Qwen3-0.6B context 1024 and not 768:
# the per-kernel profiles of both plans at both contexts (PDL off), the chunks a KV head under each plan, and the
# fold/three-launch pairs where the H100s put the 4 MiB bound
BUDGET=${BUDGET:-580}; source benchmarks/device_steps.sh
show() { grep -E "^\||rounds|not built|Error|variant" $OUT/$1.txt | grep -v "^|---" | awk -F"|" "NF>5{print \$2 \"|\" \$4 \"|\" \$6; next}{print}" | tail -${2:-6}; }
prof() { grep -E "^variant|kernels, GPU busy|^\| (qkv|attention|rope|o_proj|gate|down)" $OUT/$1.txt | cut -c1-150; }
step tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k "fused or three_launches or asks_l2 or triton or tiles_through_tma or large_products"; tail -2 $OUT/tests.txt
K="python3 benchmarks/fused_kernels.py"
Q768="model=qwen3-0.6b bs=1 context_len=768 cache_len=1024"; Q1024="model=qwen3-0.6b bs=1 context_len=1024 cache_len=1280"
step p768u 30 $K --variant attention:0 $Q768 fused.pdl=false; prof p768u
step p768f 30 $K --variant attention:1 $Q768 fused.pdl=false; prof p768f
step p1024f 30 $K --variant attention:0 $Q1024 fused.pdl=false; prof p1024f
step p1024u 30 $K --variant attention:2 $Q1024 fused.pdl=false; prof p1024u
P="python3 benchmarks/fused_prefetch.py"
step c1024f 45 $P --set chunks --only 0,2,3 $Q1024; show c1024f
step c1024u 45 $P --set chunks --only 0,2,3 $Q1024 fused.fold_attention=false; show c1024u
step a768 40 $P --set attention --only 1,2 $Q768; show a768
step a1024 40 $P --set attention --only 1,2 $Q1024; show a1024
step m512 45 $P --set attention --only 1,2 model=qwen3-1.7b bs=1 context_len=512 cache_len=768; show m512
echo "total $(( $(date +%s) - device_start_s ))s"
