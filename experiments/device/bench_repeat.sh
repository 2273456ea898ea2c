# Issue 14: how much the end-to-end bfloat16 cost moves from run to run (the
# prefill is host-bound): bench_model xla vs pallas three times, each its own
# process, random weights. No model needed. About 3 minutes.
source experiments/device/env.sh
set +e
for i in 1 2 3; do
  timeout 70 python experiments/bench_model.py --weights=random --impl=xla --impl=pallas \
    --dtype=bfloat16 --prompt_tokens=1024 --decode_tokens=64 --chunk_size=128 --repeats=3 \
    --out="$OUT/bench_model_h200_bfloat16_repeat$i.json" > "$OUT/repeat$i.log" 2>&1
  echo "run $i exit $?: $(grep -E 'bfloat16 (xla|pallas)' "$OUT/repeat$i.log" | tr '\n' ' ')"
done
