# Issue 5 on the H200, meant to run in the background (setsid) once the
# model parts are staged: waits for a bench_kernels run started earlier, then
# bench_model (xla vs pallas), two kernel-determinism processes, and the
# invariance experiment in five shards (each lands as soon as it ends).
# Everything goes to /root/out3; `DONE` marks the end, `all.tar` holds it.
source experiments/device/setup.sh
set +e
R=/root/out3
mkdir -p "$R"
while pgrep -f bench_kernels.py > /dev/null; do sleep 2; done
python experiments/bench_model.py --impl=xla --impl=pallas --prompt_tokens=1024 \
    --decode_tokens=64 --chunk_size=128 --out="$R/bench_model_h200.json" \
    > "$R/bench_model.log" 2>&1
for label in a b; do
  python experiments/kernel_determinism.py --label=call_$label \
      --out="$R/det_$label.json" > "$R/det_$label.log" 2>&1
done
for i in 0 1 2 3 4; do
  python experiments/invariance.py --impl=pallas --samples=50 \
      --chunk_sizes=1,7,64,512 --batch_sizes=1,8 --shard=$i --num_shards=5 \
      --out="$R/invariance_h200_shard${i}of5.json" > "$R/invariance_$i.log" 2>&1
done
(cd "$R" && tar cf /root/all.tar *.json *.log)
touch "$R/DONE"
