# Issue 5 on the H200, meant to run in the background (setsid) once the
# model parts are staged, and after bench_kernels and bench_model (which
# need the GPU to themselves): two kernel-determinism processes one after the
# other, and beside them the invariance experiment as ten shards of five
# samples run side by side (the float32 forwards are latency-bound, so the
# processes overlap on the GPU; bits do not depend on it). Each result lands
# in /root/out3 as soon as it ends; `DONE` marks the end.
source experiments/device/setup.sh
set +e
R=/root/out3
mkdir -p "$R"
for i in 0 1 2 3 4 5 6 7 8 9; do
  python experiments/invariance.py --impl=pallas --samples=50 \
      --chunk_sizes=1,7,64,512 --batch_sizes=1,8 --shard=$i --num_shards=10 \
      --out="$R/invariance_h200_shard${i}of10.json" > "$R/invariance_$i.log" 2>&1 &
done
for label in a b; do
  python experiments/kernel_determinism.py --label=call_$label \
      --out="$R/det_$label.json" > "$R/det_$label.log" 2>&1
done
wait
touch "$R/DONE"
