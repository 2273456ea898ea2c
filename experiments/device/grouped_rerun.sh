# Issue 14 on the H200: everything the grouped combine (BlockSizes.combine_group,
# the new defaults) can move, rerun. Start it with setsid in the first staging
# call; the model parts are staged by the next calls, the last of which
# touches /root/stage/STAGED. Results land in /root/out4 (poll with
# `tar -czf $OUT/out4.tgz -C /root/out4 .`); `DONE` marks the end. About 14 minutes.
# (Its run had the shard loops of shards.sh inline: the same commands.)
# A. No model, the GPU to itself: the attention defaults traced (grouped against
#    the former ascending defaults), then bench_kernels.
# B. Model staged, the GPU to itself: bench_model --per_op in both dtypes, and
#    float32 with bf16x3 dots.
# C. Side by side: the kernel tests natively, invariance in ten shards, the long
#    runs in five shards per dtype, two kernel-determinism processes in turn
#    (a third belongs in a later call).
source experiments/device/env.sh
set +e
OUT=/root/out4
mkdir -p "$OUT"
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/log.txt"; }
timeout 200 python experiments/bench_attention_tiles.py --time_budget_s=160 --prefill_lengths=4096 \
  --decode_lengths=32768,1024 --trace_kernels=4 \
  --bfloat16=4,64,512,4,2,1,16,16 --bfloat16=4,64,512,4,2,1,1,64 \
  --float32=4,32,256,4,1,1,32,16 --float32=4,32,256,4,1,1,1,64 \
  --out="$OUT/bench_attention_tiles_h200_defaults.json" > "$OUT/attention.log" 2>&1
say "attention defaults exit $?"
timeout 300 python experiments/bench_kernels.py --time_budget_s=240 \
  --out="$OUT/bench_kernels_h200.json" > "$OUT/bench_kernels.log" 2>&1
say "bench_kernels exit $?"
while [ ! -f /root/stage/STAGED ]; do sleep 2; done
source experiments/device/setup.sh
set +e
source experiments/device/per_op.sh
timeout 200 python experiments/bench_model.py --weights=random --dtype=float32 --prompt_tokens=1024 \
  --decode_tokens=64 --chunk_size=128 --repeats=3 --impl=xla --impl=pallas --per_op \
  --dot_precision=bf16x3 --out="$OUT/bench_model_per_op_h200_float32_bf16x3.json" \
  > "$OUT/bench_bf16x3.log" 2>&1
say "bench bf16x3 exit $?"
timeout 400 python -m pytest -q -p no:cacheprovider tests/kernels tests/models/gemma/test_matmul_tiles.py \
  > "$OUT/test_native.log" 2>&1 &
source experiments/device/shards.sh
invariance_shards "$OUT"
invariance_long_shards "$OUT"
for label in a b; do
  python experiments/kernel_determinism.py --label=call_$label \
      --out="$OUT/det_$label.json" > "$OUT/det_$label.log" 2>&1
  say "determinism $label exit $?"
done
wait
say "native tests: $(tail -1 "$OUT/test_native.log")"
touch "$OUT/DONE"
