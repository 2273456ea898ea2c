# Gemma 3 12B with seeded random weights on one GPU, bfloat16: exactness does not
# depend on the weights' values, so no checkpoint is needed. One mode a call:
#   bash experiments/device/scale.sh gate     own-position gate, 50 samples, also in another
#                                             process (6 min on an H100)
#   bash experiments/device/scale.sh graft    graft vs recompute, restore vs its pinned floor,
#                                             at PREFIXES tokens (default 1024,4096,32768)
#   bash experiments/device/scale.sh kernels  chunk invariance under Pallas at chunks 64 and
#                                             512, then Pallas vs XLA prefill and decode time
# MODEL=gemma3-27b:random runs another size (SAMPLES=20 OTHER_PROCESS=false fit its gate in
# one 10-minute call). Writes under experiments/results/scale/.
source experiments/device/common.sh
study_out scale
MODEL="${MODEL:-gemma3-12b:random}"
NAME="${MODEL%%:*}"
case "${1:-}" in
  gate)
    python experiments/exactness.py --model="$MODEL" --samples="${SAMPLES:-50}" --dtype=bfloat16 \
        --other_process="${OTHER_PROCESS:-true}" --out="$OUT/exactness_${NAME}_${GPU}.json"
    ;;
  graft)
    PREFIXES="${PREFIXES:-1024,4096,32768}"
    python experiments/bench_graft.py --model="$MODEL" --dtype=bfloat16 \
        --prefix_tokens="$PREFIXES" --repeats=3 --recompute_repeats=1 \
        --out="$OUT/bench_graft_${NAME}_${PREFIXES//,/_}_${GPU}.json"
    ;;
  kernels)
    python experiments/invariance.py --model="$MODEL" --dtype=bfloat16 --samples="${SAMPLES:-8}" \
        --chunk_sizes=64,512 --batch_sizes=1 --out="$OUT/invariance_${NAME}_${GPU}.json"
    python experiments/bench_model.py --model="$NAME" --weights=random --dtype=bfloat16 \
        --impl=xla --impl=pallas --repeats=2 --out="$OUT/bench_model_${NAME}_${GPU}.json"
    ;;
  *) echo "usage: bash experiments/device/scale.sh gate|graft|kernels" >&2; exit 2 ;;
esac
