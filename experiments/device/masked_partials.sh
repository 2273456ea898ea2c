# Issue 14, attention: the split kernel stores, and the combine loads, only the rows of a
# split's partial that saw the split (a decoded token fills G = 4 of the 16 rows), side by
# side with the kernels before (.ab_old: kernels/attention_{split,combine}.py of the commit
# before the change, ignored, carried), on one machine. A speed-only change: each
# candidate's output digest must be the same in both runs. Then the attention kernel
# tests natively. No model needed; about 2.5 minutes. Run at the commit that made the change
# (reverted after its run, docs/kernels.md), with .ab_old from the commit before it:
#
#   bash experiments/device/masked_partials.sh    # carry .whl and .ab_old
#
# Outputs are named _h200 whatever the card (the first run was on an H100: its files were
# renamed; `determinism.device_kind` in each says which).
source experiments/device/env.sh
set +e
bench() {  # bench LABEL
  timeout 130 python experiments/bench_attention_tiles.py --time_budget_s=110 \
    --prefill_lengths=4096 --decode_lengths=32768,1024 --trace_kernels=4 \
    --bfloat16=4,64,512,4,2,1,16,16 --bfloat16=4,64,256,4,3,1,128,8 \
    --float32=4,32,256,4,1,1,32,16 \
    --out="$OUT/bench_attention_tiles_h200_$1.json" > "$OUT/attention_$1.log" 2>&1
  echo "bench $1 exit $?"
}
bench masked
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_attention_kernel.py \
  > "$OUT/attention_masked_pytest.log" 2>&1
echo "pytest exit $?"; tail -1 "$OUT/attention_masked_pytest.log"
cp .ab_old/*.py kernels/
bench before
python experiments/device/tiles_ab.py "$OUT" before masked
