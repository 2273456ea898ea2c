# Issue 14 on the H200, no model. About 4 minutes.
# The combine's pairwise sum (combine_tree): its row-bit tests natively, then
# bfloat16 and float32 decode at 1k and 32k, traced, serial against pairwise.
source experiments/device/env.sh
set +e
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/log.txt"; }
timeout 120 python -m pytest -q -p no:cacheprovider tests/kernels/test_attention_kernel.py \
  -k "row_bits or combine_tree" > "$OUT/tests.log" 2>&1
say "native tests exit $?: $(tail -1 "$OUT/tests.log")"
A="4,64,512,4,2,1,16,16 4,64,512,4,2,1,16,16,1 4,64,512,4,2,1,64,16,1 4,64,512,4,2,1,64,32,1 4,64,256,4,3,1,16,16 4,64,256,4,3,1,32,16,1 4,64,256,4,3,1,128,16,1 4,64,1024,4,3,1,32,16,1"
F="4,32,256,4 4,32,256,4,1,1,16,16,1 4,32,256,4,1,1,32,16,1"
timeout 150 python experiments/bench_attention_tiles.py --time_budget_s=130 --prefill_lengths= \
  --trace_kernels=4 $(for c in $F; do echo --float32=$c; done) $(for c in $A; do echo --bfloat16=$c; done) \
  --out="$OUT/bench_attention_tiles_h200_tree.json" > "$OUT/attention.log" 2>&1
say "attention tiles exit $?"
tail -25 "$OUT/attention.log"
