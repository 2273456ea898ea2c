# First token after a graft against the fastest recompute, at full size: one model and one
# prefix length a call, seeded random weights drawn on the device, bfloat16, sliding-window
# layers in window rings. Each row sets side by side the graft/recompute ratio, the block's
# bytes and the restore over its floor (read + copy), with both sides' stages; the recompute
# is timed at a few chunk sizes (CHUNKS; 0 is the prefix in one call) and reports its
# prefill tokens/s and model-FLOP utilization. Usage:
#   bash experiments/device/graft_scale.sh MODEL PREFIX
# MODEL: gemma3-12b, gemma3-27b, gemma4-31b or gemma4-26b-a4b; PREFIX: 1024, 4096 or 32768 on
# an H100, 131072 on an H200 (blocks that keep only the rows a continuation sees: a block
# that keeps every row is 29.5 GB at 32k for gemma4-31b and does not fit beside its weights).
# Each call is meant to end within 9 minutes; the times expected are in docs/device.md.
# The memory fraction is the share of the GPU jax may use (its default, 0.75, leaves the 31B
# weights no room). Writes under experiments/results/scale/.
source experiments/device/common.sh
study_out scale
NAME="${1:-}"
PREFIX="${2:-}"
case "$NAME" in
  gemma3-12b) FRACTION=0.9 ;;
  gemma3-27b) FRACTION=0.95 ;;
  gemma4-31b) FRACTION=0.95 ;;
  gemma4-26b-a4b) FRACTION=0.95 ;;
  *) echo "usage: bash experiments/device/graft_scale.sh gemma3-12b|gemma3-27b|gemma4-31b|gemma4-26b-a4b PREFIX" >&2; exit 2 ;;
esac
case "$PREFIX" in
  1024) CHUNKS="${CHUNKS:-512,0}" ;;
  4096) CHUNKS="${CHUNKS:-512,2048,0}" ;;
  32768) CHUNKS="${CHUNKS:-512,2048,4096}" ;;  # one call of 32k: its attention scores do not fit
  131072) CHUNKS="${CHUNKS:-512,2048}" ;;
  *) echo "PREFIX is 1024, 4096, 32768 or 131072" >&2; exit 2 ;;
esac
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-$FRACTION}"
RUN="bench_graft_${NAME}_ring_${PREFIX}_${GPU}"
python experiments/bench_graft.py --model="$NAME:random" --dtype=bfloat16 --local_cache=ring \
    --prefix_tokens="$PREFIX" --repeats=5 --recompute_repeats=1 --recompute_chunks="$CHUNKS" \
    --out="$OUT/$RUN.json" 2>&1 | tee "$OUT/logs/$RUN.log"
