# Sourced by device scripts after `say` is defined: bench_model --per_op per
# dtype at IEEE, random weights, into $OUT.
for dtype in bfloat16 float32; do
  timeout 150 python experiments/bench_model.py --weights=random --impl=xla --impl=pallas --per_op \
    --dtype=$dtype --prompt_tokens=1024 --decode_tokens=64 --chunk_size=128 --repeats=3 \
    --out="$OUT/bench_model_per_op_h200_$dtype.json" > "$OUT/bench_$dtype.log" 2>&1
  say "bench $dtype exit $?: $(python -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['invariance_cost'], d['per_op_cost'])" "$OUT/bench_model_per_op_h200_$dtype.json")"
done
