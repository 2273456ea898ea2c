# Issue 14 on the H200, no model. About 3 minutes.
# Programs per split over the value columns (attention's value_splits, a
# speed knob): the attention row-bit tests natively (which compare 1, 2 and 4
# value splits bit for bit), then decode at 32k and 1k and prefill at 4k,
# traced, with 1, 2 and 4 value splits at the default tiles of each dtype.
source experiments/device/env.sh
set +e
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/log.txt"; }
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_attention_kernel.py \
  -k "row_bits or shape_errors" > "$OUT/tests.log" 2>&1
say "native tests exit $?: $(tail -1 "$OUT/tests.log")"
B=4,64,512,4,2,1,16,16
F=4,32,256,4,1,1,32,16
timeout 200 python experiments/bench_attention_tiles.py --time_budget_s=160 --prefill_lengths=4096 \
  --decode_lengths=32768,1024 --trace_kernels=4 \
  --bfloat16=$B,1 --bfloat16=$B,2 --bfloat16=$B,4 --float32=$F,1 --float32=$F,2 --float32=$F,4 \
  --out="$OUT/bench_attention_tiles_h200_value_splits.json" > "$OUT/attention.log" 2>&1
say "attention tiles exit $?"
