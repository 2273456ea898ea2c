# The invariance experiment over a cache of several attention splits (a
# 992-token prefix: capacity 1024 = 4 float32 splits of 256 slots, 2 bfloat16
# splits of 512), in both dtypes, on the H200 after the model parts are
# staged; meant to run in the background (setsid). Five shards of two samples
# per dtype, side by side; results land in /root/out3, `DONE_LONG` marks the
# end. Merge with `python experiments/invariance.py --merge=...`.
source experiments/device/setup.sh
set +e
R=/root/out3
mkdir -p "$R"
for dtype in float32 bfloat16; do
  for i in 0 1 2 3 4; do
    python experiments/invariance.py --impl=pallas --dtype=$dtype --samples=10 \
        --prefix_tokens=992 --continuation_tokens=32 --chunk_sizes=1,7,64,512 \
        --batch_sizes=1,8 --shard=$i --num_shards=5 \
        --out="$R/invariance_long_${dtype}_shard${i}of5.json" \
        > "$R/invariance_long_${dtype}_$i.log" 2>&1 &
  done
done
wait
touch "$R/DONE_LONG"
