# Issue 14, attention decode at 32k: the tile ranges computed inside the kernels
# (`split_tile_range`; the two XLA reductions of `tile_ranges` gone; commit
# 5d06e33, reverted after this run), side by side with the kernels before
# (experiments/device/ab_old: kernels/attention{,_split,_combine}.py of 54f574b,
# untracked), on one machine. To rerun: check out 5d06e33 and copy those files.
# A speed-only change: each candidate's output digest must be the same in both
# runs. Also bfloat16 candidates with splits of 256 slots, then the
# attention kernel tests natively. No model needed. About 4 minutes.
source experiments/device/env.sh
set +e
bench() {  # bench LABEL: the candidates, into $OUT/bench_attention_tiles_h200_LABEL.json
  timeout 150 python experiments/bench_attention_tiles.py --time_budget_s=120 --prefill_lengths=4096 \
    --decode_lengths=32768,1024 --trace_kernels=6 \
    --bfloat16=4,64,512,4,2,1,16,16 --bfloat16=4,64,256,4,3,1,128,8 --bfloat16=4,64,256,4,3,1,32,16 \
    --float32=4,32,256,4,1,1,32,16 \
    --out="$OUT/bench_attention_tiles_h200_$1.json" > "$OUT/attention_$1.log" 2>&1
  echo "bench $1 exit $?"; grep -v '%|' "$OUT/attention_$1.log" | grep -E 'decode|prefill' | tail -12
}
bench ranges
timeout 200 python -m pytest -q -p no:cacheprovider tests/kernels/test_attention_kernel.py \
  > "$OUT/attention_ranges_pytest.log" 2>&1
echo "pytest exit $?"; tail -1 "$OUT/attention_ranges_pytest.log"
cp experiments/device/ab_old/*.py kernels/
bench before
python experiments/device/tiles_ab.py "$OUT" before ranges
