# Issue 14, exploration on the H200 (no model): where the time goes and which
# kernel knobs are free. About 7 minutes.
# 1. profile_model per dtype (xla, pallas): device kernels of one prefill and one decode.
# 2. bench_matmul_tiles: tiles at the model's shapes, bits against the default tiles.
# 3. bench_attention_tiles: bfloat16 decode 1k/32k and prefill 4k with launch knobs.
source experiments/device/env.sh
set +e
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/log.txt"; }
for dtype in bfloat16 float32; do
  timeout 110 python experiments/profile_model.py --dtype=$dtype --impl=xla --impl=pallas \
    --top=40 --out="$OUT/profile_model_h200_$dtype.json" > "$OUT/profile_$dtype.log" 2>&1
  say "profile $dtype exit $?: $(grep -E 'prefill|decode' "$OUT/profile_$dtype.log" | tr '\n' ' ')"
done
timeout 170 python experiments/bench_matmul_tiles.py --time_budget_s=150 --iters=50 \
  --out="$OUT/bench_matmul_tiles_h200.json" > "$OUT/matmul_tiles.log" 2>&1
say "matmul tiles exit $?"
timeout 120 python experiments/bench_attention_tiles.py --time_budget_s=100 \
  --float32=4,32,256,4 \
  --bfloat16=4,64,512,4,2,1 --bfloat16=4,64,512,4,3,1 --bfloat16=4,64,512,4,4,1 --bfloat16=4,64,1024,4,3,1 --bfloat16=4,64,256,4,3,2 --bfloat16=4,128,512,4,2,1 --bfloat16=4,128,1024,4,2,1 --bfloat16=4,128,1024,8,2,1 --bfloat16=4,64,2048,4,3,1 --bfloat16=4,128,2048,8,3,1 \
  --out="$OUT/bench_attention_tiles_h200.json" > "$OUT/attention_tiles.log" 2>&1
say "attention tiles exit $?"
