# Gemma 4 31B (seeded random weights, bfloat16) tensor-parallel over a 1 x N mesh of one
# host's GPUs (2, 4 or 8 H100/H200), N = every visible GPU unless DEVICES says fewer
# (DEVICES=2 or 4 where more are visible). The weights are drawn tensor by tensor on GPU 0
# and moved straight onto their shards (no host copy). One mode a call, each made to fit a
# 9-minute call:
#   bash experiments/device/sharded_31b.sh gate      own-position gate, 20 samples (the first
#                                                    20 of the one-GPU gate's 50), blocks
#                                                    through ShardedStore
#   bash experiments/device/sharded_31b.sh kernels   grafted == single-pass prefill under
#                                                    Pallas at chunks 64 and 512, 8 samples
#   bash experiments/device/sharded_31b.sh restore   deposit through ShardedStore, restore in
#                                                    a fresh process on the same mesh
#   bash experiments/device/sharded_31b.sh bench     first token after a graft vs recompute,
#                                                    per-device restore bytes, at PREFIXES
#                                                    tokens (default 4096,32768), ring layout
#   bash experiments/device/sharded_31b.sh compare   the gate's (and kernels') per-sample
#                                                    digests against the one-GPU runs
# Writes experiments/results/sharding/sharded_<mode>_gemma4-31b_<gpu>x<N>.json (<gpu>x<N>of<M>
# where M GPUs are visible and N are used).
source experiments/device/common.sh
# NVLink multicast off: a program using it can take the host's GPUs out of service.
export NCCL_NVLS_ENABLE=0
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
study_out sharding
VISIBLE=$(python -c 'import jax; print(jax.device_count())')
N="${DEVICES:-$VISIBLE}"
NAME="gemma4-31b_${GPU}x${N}"
if [ "$N" != "$VISIBLE" ]; then NAME="${NAME}of${VISIBLE}"; fi
RUN="python experiments/sharded_gate.py --model=gemma4-31b --model_devices=$N --dtype=bfloat16"
case "${1:-}" in
  gate)
    timeout 540 $RUN --mode=gate --samples="${SAMPLES:-20}" --sample_pool=50 \
        --prefix_tokens=256 --continuation_tokens=32 --rollout_tokens=64 --chunk_size=64 \
        --out="$OUT/sharded_gate_${NAME}.json"
    ;;
  kernels)
    timeout 540 $RUN --mode=kernels --samples="${SAMPLES:-8}" --prefix_tokens=224 \
        --continuation_tokens=32 --chunk_sizes=64,512 --out="$OUT/sharded_kernels_${NAME}.json"
    ;;
  restore)
    timeout 540 $RUN --mode=restore --samples="${SAMPLES:-4}" --prefix_tokens=256 \
        --continuation_tokens=32 --chunk_size=64 --out="$OUT/sharded_restore_${NAME}.json"
    ;;
  bench)
    PREFIXES="${PREFIXES:-4096,32768}"
    timeout 540 $RUN --mode=bench --prefixes="$PREFIXES" --repeats=3 --bench_chunk=1024 \
        --local_cache=ring --out="$OUT/sharded_bench_${NAME}.json"
    ;;
  compare)
    python experiments/sharded_gate.py --mode=compare --sharded="$OUT/sharded_gate_${NAME}.json" \
        --single=experiments/results/scale/exactness_gemma4-31b_h100.json \
        --out="$OUT/compare_gate_${NAME}.json"
    SINGLE=experiments/results/scale/invariance_gemma4-31b_${GPU}.json
    if [ -f "$SINGLE" ] && [ -f "$OUT/sharded_kernels_${NAME}.json" ]; then
      python experiments/sharded_gate.py --mode=compare \
          --sharded="$OUT/sharded_kernels_${NAME}.json" --single="$SINGLE" \
          --out="$OUT/compare_kernels_${NAME}.json"
    else
      echo "no one-GPU Pallas run $SINGLE (bash experiments/device/gemma4_31b_gate.sh kernels)" >&2
    fi
    ;;
  *) echo "usage: bash experiments/device/sharded_31b.sh gate|kernels|restore|bench|compare" >&2; exit 2 ;;
esac
