# Issue 14: the GPU matmul tile table (ops.gpu_matmul_tiles) on the H200, after
# the model parts are staged. About 8.5 minutes.
# 1. Side by side: the kernel and tile tests natively; invariance shard 0 of 10
#    (5 float32 samples, the committed command) whose logits digests must equal
#    the committed shard's (the tiles change no bit of the real model).
# 2. The GPU to itself: bench_model --per_op per dtype.
# verdict.txt says what passed; results land in $OUT.
source experiments/device/setup.sh
set +e
T0=$SECONDS
V="$OUT/verdict.txt"
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$V"; }
timeout 200 python -m pytest -q -p no:cacheprovider tests/kernels tests/models/gemma/test_matmul_tiles.py \
  tests/models/gemma/test_matmul_decode_dispatch.py > "$OUT/test_native.log" 2>&1 &
TESTS=$!
timeout 260 python experiments/invariance.py --impl=pallas --samples=50 --chunk_sizes=1,7,64,512 \
  --batch_sizes=1,8 --shard=0 --num_shards=10 --out="$OUT/invariance_h200_shard0of10_tiles.json" \
  > "$OUT/invariance.log" 2>&1 &
INV=$!
wait $TESTS; say "native tests exit $?: $(tail -1 "$OUT/test_native.log")"
wait $INV; say "invariance shard 0 exit $?"
python experiments/device/same_digests.py "$OUT/invariance_h200_shard0of10_tiles.json" \
  experiments/results/runs/invariance_h200_shard0of10_combine.json | tee -a "$V"
source experiments/device/per_op.sh
