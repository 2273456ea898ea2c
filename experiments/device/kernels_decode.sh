# Issue 14, the decode matmul (kernels/matmul_decode.py) on the H200: are its
# row bits the prefill kernel's natively, and what is invariance_cost with it.
# Needs no model (the speed benchmark runs gemma-3-270m's shapes with seeded
# random weights, like the committed per-op results). About 5 minutes; at
# most 7 if every stage runs to its timeout.
#
# 1. Bits (in parallel, up to 120 s): tests/kernels/test_matmul_decode.py and
#    the model dispatch test natively; beside them the existing kernel tests.
#    A variant is shown for a dtype when every row-bit case of that dtype and
#    variant passed; verdict.txt lists each.
# 2. Speed (one after the other, the GPU to itself): bench_model --per_op for
#    each dtype with GRAFTJAX_MATMUL_DECODE set to the shown variant ('rows'
#    preferred). Output: bench_model_per_op_h200_<dtype>.json. If no variant
#    was shown for a dtype, the benchmark still runs with 'rows' but its file
#    is UNSHOWN_bench_model_per_op_h200_<dtype>.json and verdict.txt says so
#    (keep MATMUL_DECODE_SHOWN without that dtype; bits may differ).
# Then: put each shown (('gpu', dtype), variant) into ops.MATMUL_DECODE_SHOWN.
# Logs: test_matmul_decode.log, test_kernels.log, bench_<dtype>.log, verdict.txt.
source experiments/device/env.sh
set +e
T0=$SECONDS
V="$OUT/verdict.txt"
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$V"; }

say "decode matmul bits, natively on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout 120 python -m pytest -q -rA -p no:cacheprovider tests/kernels/test_matmul_decode.py \
    tests/models/gemma/test_matmul_decode_dispatch.py > "$OUT/test_matmul_decode.log" 2>&1 &
NEW=$!
timeout 120 python -m pytest -q -p no:cacheprovider tests/kernels \
    --ignore=tests/kernels/test_matmul_decode.py > "$OUT/test_kernels.log" 2>&1 &
OLD=$!
wait $NEW; NEW_RC=$?
say "new tests exit $NEW_RC (0 all passed, 1 some failed, else incomplete): $(tail -1 "$OUT/test_matmul_decode.log")"
wait $OLD; say "existing kernel tests exit $?: $(tail -1 "$OUT/test_kernels.log")"

L="$OUT/test_matmul_decode.log"
declare -A SHOWN
for dtype in bfloat16 float32; do
  for variant in rows transposed; do
    case="test_row_bits_equal_prefill_kernel\[.*-$dtype-$variant\]"
    passed=$(grep -cE "^PASSED .*$case" "$L")
    other=$(grep -cE "^(FAILED|ERROR) .*$case" "$L")
    if [ "$NEW_RC" -le 1 ] && [ "$passed" -gt 0 ] && [ "$other" -eq 0 ]; then
      say "BITS EQUAL   $dtype $variant: $passed of $passed cases"
      [ -z "${SHOWN[$dtype]}" ] && SHOWN[$dtype]=$variant
    else
      say "NOT SHOWN    $dtype $variant: $passed passed, $other failed or errored (see $L)"
    fi
  done
done
for variant in rows transposed; do
  say "tiny model, $variant: $(grep -E "test_pallas_model_keeps_its_bits\[$variant\]" "$L" \
      | grep -E '^(PASSED|FAILED|ERROR)' | cut -d' ' -f1)"
done

for dtype in bfloat16 float32; do
  variant=${SHOWN[$dtype]:-rows}
  name=bench_model_per_op_h200_$dtype.json
  if [ -z "${SHOWN[$dtype]}" ]; then
    name=UNSHOWN_$name
    say "NOT SHOWN: $dtype has no variant with equal bits; timing 'rows' anyway -> $name"
  fi
  say "bench_model --per_op $dtype with GRAFTJAX_MATMUL_DECODE=$variant"
  GRAFTJAX_MATMUL_DECODE=$variant timeout 140 python experiments/bench_model.py \
      --weights=random --impl=xla --impl=pallas --per_op --dtype=$dtype \
      --prompt_tokens=1024 --decode_tokens=64 --chunk_size=128 --repeats=3 \
      --out="$OUT/$name" > "$OUT/bench_$dtype.log" 2>&1
  say "bench $dtype exit $? (124 = timed out)"
  python - "$OUT/$name" "experiments/results/bench_model_per_op_h200_$dtype.json" <<'EOF' | tee -a "$V"
import json, sys
new, old = (json.load(open(p)) for p in sys.argv[1:])
for label, d in (('new', new), ('committed', old)):
  print(label, d.get('matmul_decode'), json.dumps(d['invariance_cost']),
        'per_op matmul', json.dumps(d['per_op_cost'][next(iter(d['per_op_cost']))]['matmul']))
EOF
done
say done
