#!/usr/bin/env bash
# The README's ladder on one lease: MODES (a part of eager,graphed,compiled,fused), then the fold pairings that fit
BUDGET=${BUDGET:-560}; source benchmarks/device_steps.sh
step ladder 200 python3 -m harness -m +experiment=ladder mode=$MODES
grep -v '^\[harness\]' $OUT/ladder.txt | tail -25
tar czf $OUT/ladder.tgz outputs mlruns 2>/dev/null; ls -la $OUT
P="python3 benchmarks/fused_prefetch.py --set attention"
show() { grep -E "^\||rounds|not built|Error" $OUT/pairs.txt | grep -v "^|---" | cut -c1-60,170- | tail -${1:-3}; }
for w in $PAIRS; do
  m=${w%%:*}; rest=${w#*:}; bs=${rest%%:*}; ctx=${rest#*:}
  step pairs 45 $P model=$m bs=$bs context_len=$ctx cache_len=$((ctx + 256)) && show
done
echo "total $(( $(date +%s) - device_start_s ))s"
