# Gemma 3 12B with seeded random weights on one GPU, bfloat16: exactness does not
# depend on the weights' values, so no checkpoint is needed. One mode a call:
#   bash experiments/device/scale.sh gate     own-position gate, 50 samples, also in another
#                                             process (6 min on an H100)
#   bash experiments/device/scale.sh graft    graft vs recompute, restore vs its pinned floor,
#                                             at PREFIXES tokens (default 1024,4096,32768)
#   bash experiments/device/scale.sh kernels  chunk invariance under Pallas at chunks 64 and
#                                             512, then Pallas vs XLA prefill and decode time
#   bash experiments/device/scale.sh tiles    decode (1-row) matmul tiles at the model's
#                                             projection shapes, against the shipped ones
#   bash experiments/device/scale.sh decode   where decode time goes, per kernel (XLA and
#                                             Pallas), and the RMS norm's launch at the width
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
  tiles)
    candidates=()
    for tile in 16,64,128,4,3 16,128,128,4,3 16,256,128,4,3 16,128,128,8,3 16,256,128,8,3 \
        16,128,128,4,4 16,256,128,8,4 16,32,128,4,4 16,32,128,4,5 16,64,128,4,4 16,64,128,4,5 \
        16,64,128,4,6 16,32,128,2,4 16,64,128,2,5; do
      candidates+=(--candidate="$tile")
    done
    python experiments/bench_matmul_tiles.py --model="$NAME" --rows=1 --dtype=bfloat16 \
        --default=16,32,128,4,3 "${candidates[@]}" --iters=50 \
        --out="$OUT/runs/bench_matmul_tiles_${NAME}_decode_${GPU}.json"
    ;;
  decode)
    python experiments/profile_model.py --model="$NAME" --dtype=bfloat16 --impl=xla \
        --impl=pallas --prompt_tokens=1024 --decode_tokens=32 --top=40 \
        --out="$OUT/runs/profile_model_${NAME}_${GPU}_bfloat16.json"
    width=$(python -c "from graftjax.models.gemma import config; print(config.get_config('$NAME').embed_dim)")
    python experiments/bench_kernels.py --kernels=rms_norm --aux_lengths=1,4096 \
        --dtype=bfloat16 --dtype=float32 --norm_dim="$width" --norm_warps=1,2,4,8 \
        --out="$OUT/runs/bench_kernels_rms_norm_d${width}_${GPU}.json"
    ;;
  *) echo "usage: bash experiments/device/scale.sh gate|graft|kernels|tiles|decode" >&2; exit 2 ;;
esac
