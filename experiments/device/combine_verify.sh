# Issue 14 on the H200, after the model parts are staged. About 8 minutes.
# The combine now takes its maxima in one reduction (exact in any order: no bit may move).
# 1. Side by side: the kernel tests natively; invariance shard 0 of 10 (float32, the
#    committed command) whose digests must equal the committed shard's.
# 2. Invariance shard 0 with float32 products split into bfloat16 pieces (bf16x3):
#    grafted == single pass on the real model under the split.
# 3. bench_attention_tiles, bfloat16 decode at 1k and 32k, traced: the combine's time now.
source experiments/device/setup.sh
set +e
T0=$SECONDS
V="$OUT/verdict.txt"
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$V"; }
timeout 240 python -m pytest -q -p no:cacheprovider tests/kernels > "$OUT/test_native.log" 2>&1 &
TESTS=$!
INV="python experiments/invariance.py --impl=pallas --samples=50 --chunk_sizes=1,7,64,512 --batch_sizes=1,8 --shard=0 --num_shards=10"
timeout 240 $INV --out="$OUT/invariance_h200_shard0of10_maxonce.json" > "$OUT/invariance.log" 2>&1 &
PID=$!
wait $TESTS; say "native kernel tests exit $?: $(tail -1 "$OUT/test_native.log")"
wait $PID; say "invariance shard 0 exit $?"
python experiments/device/same_digests.py "$OUT/invariance_h200_shard0of10_maxonce.json" \
  experiments/results/runs/invariance_h200_shard0of10_combine.json | tee -a "$V"
timeout 200 $INV --dot_precision=bf16x3 --out="$OUT/invariance_h200_shard0of10_bf16x3.json" \
  > "$OUT/invariance_bf16x3.log" 2>&1
say "invariance shard 0 bf16x3 exit $?: $(grep -iE 'byte|equal' "$OUT/invariance_bf16x3.log" | tail -3 | tr '\n' ' ')"
A="4,64,512,4 4,128,512,4,2,1,8,16 4,64,512,4,2,1,16,16 4,64,256,4,3,1,16,16 4,64,256,4,3,1,32,16 4,64,1024,4,3,1,8,16 4,128,1024,4,2,1,8,16"
timeout 100 python experiments/bench_attention_tiles.py --time_budget_s=85 --prefill_lengths= \
  --trace_kernels=4 --float32=4,32,256,4 $(for c in $A; do echo --bfloat16=$c; done) \
  --out="$OUT/bench_attention_tiles_h200_maxonce.json" > "$OUT/attention.log" 2>&1
say "attention tiles exit $?"
