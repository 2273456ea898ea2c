# Issue 14 on the H200, no model. About 4 minutes.
# The combine's sum by groups (BlockSizes.combine_group: each step's splits as
# one masked [U, R, Hc] load, summed in one reduction): its row-bit tests
# natively, then decode at 1k and 32k and prefill at 4k, traced: the former
# default and the best ascending launch against grouped candidates. (Its run,
# runs/bench_attention_tiles_h200_grouped.json, spelled the groups as a
# ninth field 'grouped', and the ascending sums as no ninth field, then
# unrolled 8 or 16 splits a loop step: the same sums.)
source experiments/device/env.sh
set +e
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/log.txt"; }
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_attention_kernel.py \
  -k "row_bits or combine_groups" > "$OUT/tests.log" 2>&1
say "native tests exit $?: $(tail -1 "$OUT/tests.log")"
timeout 230 python experiments/bench_attention_tiles.py --time_budget_s=190 --prefill_lengths=4096 \
  --decode_lengths=32768,1024 --trace_kernels=4 \
  --bfloat16=4,64,512,4,2,1,1,64 --bfloat16=4,64,512,4,2,1,1,16 \
  --bfloat16=4,64,512,4,2,1,64,16 --bfloat16=4,64,512,4,2,1,64,8 \
  --bfloat16=4,64,512,4,2,1,16,16 --bfloat16=4,64,256,4,3,1,128,8 \
  --bfloat16=4,64,256,4,3,1,32,16 \
  --float32=4,32,256,4,1,1,1,64 --float32=4,32,256,4,1,1,1,16 --float32=4,32,256,4,1,1,128,8 \
  --float32=4,32,256,4,1,1,32,16 \
  --out="$OUT/bench_attention_tiles_h200_grouped.json" > "$OUT/attention.log" 2>&1
say "attention tiles exit $?"
