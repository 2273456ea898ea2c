# Gemma 4 31B with seeded random weights on one GPU, bfloat16: exactness does not depend
# on the weights' values, so no checkpoint is needed. The weights (61.4 GB in bfloat16,
# experiments/results/kv_bytes) are drawn tensor by tensor on the device
# (`model.random` through `random_init`: no host copy), so they fit an 80 GB H100 with
# about 20 GB to spare. One mode a call:
#   bash experiments/device/gemma4_31b_gate.sh gate     own-position gate, 50 samples, also
#                                                       in another process
#   bash experiments/device/gemma4_31b_gate.sh kernels  grafted == single-pass prefill under
#                                                       Pallas at chunks 64 and 512
#   bash experiments/device/gemma4_31b_gate.sh graft    first token after a graft vs recompute,
#                                                       restore vs its pinned floor, ring layout,
#                                                       at PREFIXES tokens (default 1024,4096)
# On an H100 a sample with a 128-token rollout takes 10.7 s (50 did not fit one 10-minute call);
# with 64 (ROLLOUT, the default here) 6.5 s: OTHER_PROCESS=false runs the 50 in 7 minutes, and
# the other process needs a call of its own (SAMPLES=20 fits). A 32,768-token block of this
# model is 29.5 GB packed (every layer's rows, the sliding layers' older ones zero) and is
# installed on the device beside the weights: PREFIXES=32768 needs more than one H100 holds.
# experiments/device/graft_scale.sh runs the graft bench one prefix a call at every size.
# Writes under experiments/results/scale/.
source experiments/device/common.sh
# At jax's default 0.75 the weights leave about 2 GB: a 777-token capture ran out of memory.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
study_out scale
# jax may use 95% of the GPU: its default share (75%) leaves the 61.4 GB of weights no room.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
MODEL=gemma4-31b:random
NAME=gemma4-31b
case "${1:-}" in
  gate)
    python experiments/exactness.py --model="$MODEL" --samples="${SAMPLES:-50}" --dtype=bfloat16 \
        --rollout_tokens="${ROLLOUT:-64}" --other_process="${OTHER_PROCESS:-true}" \
        --out="$OUT/exactness_${NAME}_${GPU}.json"
    ;;
  kernels)
    python experiments/invariance.py --model="$MODEL" --impl=pallas --dtype=bfloat16 \
        --samples="${SAMPLES:-8}" --chunk_sizes=64,512 --batch_sizes=1 \
        --out="$OUT/invariance_${NAME}_${GPU}.json"
    ;;
  graft)
    PREFIXES="${PREFIXES:-1024,4096}"
    python experiments/bench_graft.py --model="$MODEL" --dtype=bfloat16 --local_cache=ring \
        --prefix_tokens="$PREFIXES" --repeats=3 --recompute_repeats=1 \
        --out="$OUT/bench_graft_${NAME}_ring_${PREFIXES//,/_}_${GPU}.json"
    ;;
  *) echo "usage: bash experiments/device/gemma4_31b_gate.sh gate|kernels|graft" >&2; exit 2 ;;
esac
