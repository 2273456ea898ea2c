# Issue 14, attention decode at 32k: the tile ranges computed inside the kernels
# (`split_tile_range`; the two XLA reductions of `tile_ranges` gone) at the
# current defaults (their output digests must equal those of
# bench_attention_tiles_h200_defaults.json: a speed-only change), beside bfloat16
# candidates with splits of 256 slots. Then the attention kernel tests natively.
# No model needed. About 3 minutes.
source experiments/device/env.sh
set +e
timeout 200 python experiments/bench_attention_tiles.py --time_budget_s=170 --prefill_lengths=4096 \
  --decode_lengths=32768,1024 --trace_kernels=6 \
  --bfloat16=4,64,512,4,2,1,16,16 --bfloat16=4,64,256,4,3,1,128,8 \
  --bfloat16=4,64,256,4,3,1,32,16 --bfloat16=4,64,256,4,2,1,64,16 \
  --float32=4,32,256,4,1,1,32,16 \
  --out="$OUT/bench_attention_tiles_h200_ranges.json" > "$OUT/attention_ranges.log" 2>&1
echo "bench exit $?"; grep -v '%|' "$OUT/attention_ranges.log" | tail -20
timeout 240 python -m pytest -q -p no:cacheprovider tests/kernels/test_attention_kernel.py \
  > "$OUT/attention_ranges_pytest.log" 2>&1
echo "pytest exit $?"; tail -3 "$OUT/attention_ranges_pytest.log"
