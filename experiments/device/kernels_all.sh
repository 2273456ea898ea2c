# Issue 5 on the H200, meant to run in the background (setsid) once the
# model parts are staged. If an earlier call started bench_kernels in the
# background with its pid in /root/bench_kernels.pid, waits for it (a
# `pgrep -f` would match the calling shell's own command line); otherwise
# runs it. Then, with the GPU to itself, bench_model (xla vs pallas). Then
# side by side: the invariance experiment as ten shards of five samples (the
# float32 forwards are latency-bound, so the processes overlap on the GPU;
# bits do not depend on it), and two kernel-determinism processes one after
# the other. Each result lands in /root/out3 as soon as it ends; `DONE`
# marks the end. Copy /root/out3 into $OUT in every polling call: a machine
# left 30 s without a call goes cold and takes /root with it.
source experiments/device/setup.sh
set +e
R=/root/out3
mkdir -p "$R"
if [ -f /root/bench_kernels.pid ]; then
  while kill -0 "$(cat /root/bench_kernels.pid)" 2> /dev/null; do sleep 2; done
else
  python experiments/bench_kernels.py --time_budget_s=240 \
      --out="$R/bench_kernels_h200.json" > "$R/bench_kernels.log" 2>&1
fi
python experiments/bench_model.py --impl=xla --impl=pallas --prompt_tokens=1024 \
    --decode_tokens=64 --chunk_size=128 --out="$R/bench_model_h200.json" \
    > "$R/bench_model.log" 2>&1
source experiments/device/shards.sh
invariance_shards "$R"
for label in a b; do
  python experiments/kernel_determinism.py --label=call_$label \
      --out="$R/det_$label.json" > "$R/det_$label.log" 2>&1
done
wait
touch "$R/DONE"
