# The invariance_cost study on a GPU: what the chunk-invariant Pallas kernels
# cost against XLA. The kernels alone, the attention and matmul tile sweeps,
# the model end to end (real weights), then per op with seeded random weights.
source experiments/device/common.sh
study_out invariance_cost
python experiments/bench_kernels.py --time_budget_s=240 --out="$OUT/bench_kernels_${GPU}.json"
python experiments/bench_attention_tiles.py --time_budget_s=300 \
    --out="$OUT/bench_attention_tiles_${GPU}.json"
python experiments/bench_matmul_tiles.py --time_budget_s=150 --iters=50 \
    --out="$OUT/bench_matmul_tiles_${GPU}.json"
python experiments/bench_model.py --impl=xla --impl=pallas --prompt_tokens=1024 \
    --decode_tokens=64 --chunk_size=128 --out="$OUT/bench_model_${GPU}.json"
for dtype in bfloat16 float32; do
  python experiments/bench_model.py --weights=random --impl=xla --impl=pallas --per_op \
      --dtype=$dtype --prompt_tokens=1024 --decode_tokens=64 --chunk_size=128 --repeats=3 \
      --out="$OUT/bench_model_per_op_${GPU}_$dtype.json"
done
