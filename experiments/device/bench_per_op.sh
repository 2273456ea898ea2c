# Issue 14 on the H200, no model. About 8 minutes.
# 1. bench_model --per_op per dtype at IEEE ('highest'), on the current kernels.
# 2. bench_matmul_tiles, float32 at bf16x3 (block_k 32): decode (1 row) and prefill (128 rows).
source experiments/device/env.sh
set +e
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/log.txt"; }
source experiments/device/per_op.sh
M1="16,32,32,4,3 16,64,32,4,3 16,128,32,4,3 16,256,32,4,3 16,64,32,2,3 16,128,32,8,3"
M128="64,128,32,4,3 128,64,32,4,3 128,128,32,8,3 64,256,32,8,3 32,64,32,4,3"
timeout 80 python experiments/bench_matmul_tiles.py --time_budget_s=65 --dtype=float32 --rows=1 \
  --precision=bf16x3 $(for c in $M1; do echo --candidate=$c; done) \
  --out="$OUT/bench_matmul_tiles_h200_float32_bf16x3_rows1.json" > "$OUT/mt1.log" 2>&1
say "matmul tiles rows=1 exit $?"
timeout 80 python experiments/bench_matmul_tiles.py --time_budget_s=65 --dtype=float32 --rows=128 \
  --precision=bf16x3 --shape=q --shape=kv --shape=o --shape=gate_up --shape=down \
  $(for c in $M128; do echo --candidate=$c; done) \
  --out="$OUT/bench_matmul_tiles_h200_float32_bf16x3_rows128.json" > "$OUT/mt128.log" 2>&1
say "matmul tiles rows=128 exit $?"
