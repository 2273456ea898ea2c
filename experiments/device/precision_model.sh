# Issue 14, float32 with bfloat16-split dots (kernels/dots.py) on the H200, no model
# (random weights time the same). About 7 minutes.
# 1. The native tests of the split: dots, matmul rows, attention row bits, GPU tiles.
# 2. bench_model float32, 1024-token prompt, 64 decode tokens, fastest of 3:
#    XLA at IEEE (the baseline), then XLA and Pallas at bf16x3 (with --per_op) and bf16x6.
source experiments/device/env.sh
set +e
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/log.txt"; }
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_dots.py \
  tests/kernels/test_matmul_kernel.py tests/models/gemma/test_matmul_tiles.py \
  "tests/kernels/test_attention_kernel.py::test_row_bits_do_not_depend_on_chunk_batch_or_history" \
  > "$OUT/tests.log" 2>&1
say "native tests exit $?: $(tail -1 "$OUT/tests.log")"
B="python experiments/bench_model.py --weights=random --dtype=float32 --prompt_tokens=1024 --decode_tokens=64 --chunk_size=128 --repeats=3"
timeout 60 $B --impl=xla --dot_precision=highest \
  --out="$OUT/bench_model_h200_float32_highest_xla.json" > "$OUT/bm_highest.log" 2>&1
say "highest xla exit $?: $(grep -E '^float32' "$OUT/bm_highest.log" | tr '\n' ' ')"
timeout 200 $B --impl=xla --impl=pallas --per_op --dot_precision=bf16x3 \
  --out="$OUT/bench_model_per_op_h200_float32_bf16x3.json" > "$OUT/bm_bf16x3.log" 2>&1
say "bf16x3 exit $?: $(grep -E '^float32' "$OUT/bm_bf16x3.log" | tr '\n' ' ')"
timeout 100 $B --impl=xla --impl=pallas --dot_precision=bf16x6 \
  --out="$OUT/bench_model_h200_float32_bf16x6.json" > "$OUT/bm_bf16x6.log" 2>&1
say "bf16x6 exit $?: $(grep -E '^float32' "$OUT/bm_bf16x6.log" | tr '\n' ' ')"
