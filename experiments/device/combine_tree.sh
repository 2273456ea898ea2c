# Issue 14 on the H200, no model. About 2 minutes.
# The combine's pairwise sum (combine_tree): its row-bit tests natively, then
# decode at 32k, traced: bfloat16 serial against pairwise (16 splits a step,
# all 64 in one), and float32 pairwise. A first, wider sweep (1k and 32k, 11
# candidates) ran past its timeout: logs/bench_attention_tiles_h200_tree_partial.log.
source experiments/device/env.sh
set +e
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/log.txt"; }
timeout 120 python -m pytest -q -p no:cacheprovider tests/kernels/test_attention_kernel.py \
  -k "row_bits or combine_tree" > "$OUT/tests.log" 2>&1
say "native tests exit $?: $(tail -1 "$OUT/tests.log")"
timeout 200 python experiments/bench_attention_tiles.py --time_budget_s=150 --prefill_lengths= \
  --decode_lengths=32768 --trace_kernels=4 --float32=4,32,256,4,1,1,32,16,1 \
  --bfloat16=4,64,512,4,2,1,16,16 --bfloat16=4,64,512,4,2,1,16,16,1 --bfloat16=4,64,512,4,2,1,64,16,1 \
  --out="$OUT/bench_attention_tiles_h200_tree.json" > "$OUT/attention.log" 2>&1
say "attention tiles exit $?"
