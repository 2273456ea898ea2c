# Gemma 3 12B with seeded random weights on one GPU, bfloat16: exactness does not
# depend on the weights' values, so no checkpoint is needed.
#   bash experiments/device/scale.sh gate     own-position gate, 50 samples (about 4 min),
#                                             then graft vs recompute at 1k/4k/32k (about 4 min)
#   bash experiments/device/scale.sh kernels  chunk invariance under Pallas at chunks 64 and
#                                             512, then Pallas vs XLA prefill and decode time
# MODEL=gemma3-27b:random runs another size. Writes under experiments/results/scale/.
source experiments/device/common.sh
study_out scale
MODEL="${MODEL:-gemma3-12b:random}"
NAME="${MODEL%%:*}"
case "${1:-}" in
  gate)
    python experiments/exactness.py --model="$MODEL" --samples=50 --dtype=bfloat16 \
        --out="$OUT/exactness_${NAME}_${GPU}.json"
    python experiments/bench_graft.py --model="$MODEL" --dtype=bfloat16 \
        --prefix_tokens=1024,4096,32768 --repeats=3 --recompute_repeats=1 \
        --out="$OUT/bench_graft_${NAME}_${GPU}.json"
    ;;
  kernels)
    python experiments/invariance.py --model="$MODEL" --dtype=bfloat16 --samples=8 \
        --chunk_sizes=64,512 --batch_sizes=1 --out="$OUT/invariance_${NAME}_${GPU}.json"
    python experiments/bench_model.py --model="$NAME" --weights=random --dtype=bfloat16 \
        --impl=xla --impl=pallas --repeats=3 --out="$OUT/bench_model_${NAME}_${GPU}.json"
    ;;
  *) echo "usage: bash experiments/device/scale.sh gate|kernels" >&2; exit 2 ;;
esac
