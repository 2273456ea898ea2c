# Restore against its pinned floor on the H200 (issue 14's restore target: at most 1.5x the
# floor at every size from 1k to 32k; issue 13.6's honest floor). The real model in float32,
# run after the six model parts are staged (docs/device.md), in one call of about 3 minutes:
#
#   bash experiments/device/restore.sh
#
# For each prefix of 1,024 to 32,768 tokens: the block is stored, then restored 5 times
# through one `graftjax.restore.Staging` (pinned host buffers, written through a host view
# checked by a round trip; `staging_memory` in each row says which memory was used), each
# restore timed by stage (read + verify into staging, new cache, install = pinned
# host-to-device copy + in-place write, first token), and set against its floors
# (`graftjax.studies.restore_floor`: the block's files read with 16 threads into touched
# memory plus a `jax.device_put` from a pre-pinned array to the device; with SHA-256; and
# the old pageable floor). Recompute (prefill + first token) runs too, and the logits of
# both are compared byte for byte. Writes $OUT/bench_graft_h200.json (replaces the committed
# experiments/results/bench_graft_h200.json) and $OUT/restore_h200.log.
#
#   bash experiments/device/restore.sh pagein   # optional, in a call of its own (~3 minutes)
#
# runs page-in against re-prefill for blocks of 32 to 8,192 tokens (issue 13.6 on the H200:
# the policy and its crossover), writing $OUT/paging_pagein_h200.json and $OUT/pagein_h200.log.
source experiments/device/setup.sh
set +e
if [ "$1" = pagein ]; then
  timeout 230 python3 experiments/bench_paging_pagein.py \
      --tokens=32,64,128,256,512,1024,2048,4096,8192 --repeats=5 --recompute_repeats=5 \
      --out="$OUT/paging_pagein_h200.json" > "$OUT/pagein_h200.log" 2>&1
  status=$?
  grep -v '%|' "$OUT/pagein_h200.log" | tail -12
  exit $status
fi
timeout 230 python3 experiments/bench_graft.py \
    --prefix_tokens=1024,2048,4096,8192,16384,32768 --repeats=5 \
    --out="$OUT/bench_graft_h200.json" > "$OUT/restore_h200.log" 2>&1
status=$?
grep -v '%|' "$OUT/restore_h200.log" | tail -12
nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current --format=csv \
    >> "$OUT/restore_h200.log" 2>&1
exit $status
