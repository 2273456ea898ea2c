# Sourced by device scripts: the invariance runs as side-by-side processes
# (the float32 forwards are latency-bound, so they overlap on the GPU; bits do
# not depend on it), each started in the background; the caller waits.
# invariance_shards DIR: the 50-sample table in ten shards of five samples.
invariance_shards() {
  for i in 0 1 2 3 4 5 6 7 8 9; do
    python experiments/invariance.py --impl=pallas --samples=50 \
        --chunk_sizes=1,7,64,512 --batch_sizes=1,8 --shard=$i --num_shards=10 \
        --out="$1/invariance_h200_shard${i}of10.json" > "$1/invariance_$i.log" 2>&1 &
  done
}
# invariance_long_shards DIR: over a cache of several attention splits (a
# 992-token prefix: capacity 1024 = 4 float32 splits of 256 slots, 2 bfloat16
# splits of 512), five shards of two samples per dtype.
invariance_long_shards() {
  for dtype in float32 bfloat16; do
    for i in 0 1 2 3 4; do
      python experiments/invariance.py --impl=pallas --dtype=$dtype --samples=10 \
          --prefix_tokens=992 --continuation_tokens=32 --chunk_sizes=1,7,64,512 \
          --batch_sizes=1,8 --shard=$i --num_shards=5 \
          --out="$1/invariance_long_${dtype}_shard${i}of5.json" \
          > "$1/invariance_long_${dtype}_$i.log" 2>&1 &
    done
  done
}
