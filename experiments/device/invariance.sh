# The invariance study on a GPU with the Pallas kernels: a grafted continuation
# in every chunk and batch size against one single-pass prefill. Side by side
# (the float32 forwards are latency-bound, so processes overlap; bits do not
# depend on it): the 50-sample table in ten shards of five, then over a
# 1,024-slot cache (several attention splits) five shards of two samples per
# dtype. Each table is merged from its shards, which stay in runs/.
# Needs the real model.
source experiments/device/common.sh
study_out invariance
for i in 0 1 2 3 4 5 6 7 8 9; do
  python experiments/invariance.py --impl=pallas --samples=50 --chunk_sizes=1,7,64,512 \
      --batch_sizes=1,8 --shard=$i --num_shards=10 \
      --out="$OUT/runs/invariance_${GPU}_shard${i}of10.json" > "$OUT/logs/invariance_$i.log" 2>&1 &
done
wait
for dtype in float32 bfloat16; do
  for i in 0 1 2 3 4; do
    python experiments/invariance.py --impl=pallas --dtype=$dtype --samples=10 \
        --prefix_tokens=992 --continuation_tokens=32 --chunk_sizes=1,7,64,512 \
        --batch_sizes=1,8 --shard=$i --num_shards=5 \
        --out="$OUT/runs/invariance_long_${dtype}_shard${i}of5.json" \
        > "$OUT/logs/invariance_long_${dtype}_$i.log" 2>&1 &
  done
done
wait
shards() { ls "$OUT"/runs/$1 | paste -sd, -; }
python experiments/invariance.py --merge="$(shards "invariance_${GPU}_shard*of10.json")" \
    --out="$OUT/invariance_${GPU}.json"
for dtype in float32 bfloat16; do
  python experiments/invariance.py --merge="$(shards "invariance_long_${dtype}_shard*of5.json")" \
      --out="$OUT/invariance_${GPU}_long_$dtype.json"
done
