# Issue 14, next step for attention decode at 32k: where one call's time goes
# (tile_ranges' XLA ops, the split kernel, the combine), from a jax trace of
# each candidate, beside its timing. No model needed. About 2 minutes.
source experiments/device/env.sh
timeout 150 python experiments/bench_attention_tiles.py --time_budget_s=120 --prefill_lengths= \
  --trace_kernels=8 --float32=4,32,256,4 \
  --bfloat16=4,64,512,4 --bfloat16=4,128,512,4,2,1,8,16 --bfloat16=4,64,256,4,3,1,8,16 \
  --out="$OUT/bench_attention_tiles_h200_traced.json" > "$OUT/attention_trace.log" 2>&1
echo "exit $?"; tail -3 "$OUT/attention_trace.log"
