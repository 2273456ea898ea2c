# The flywheel_compose study on a GPU: the items of flywheel.sh's 70 templates
# deposited (the base model's greedy 256-token attempt where it verifies, else
# the reference solution), float32, rope_relative, Pallas kernels. Each item
# asked again after its own block and 0-2 routed distractors (logits against a
# fresh block-attention prefill, packed and shifted by a page); one new
# instance per template answered after the top-1 and top-3 routed blocks.
# Prefill chunks of 8 keep the compiled shapes few; questions stop 240 s after
# the model starts loading (the result counts what was not asked). Needs the
# real model.
source experiments/device/common.sh
study_out flywheel_compose
LIBRARY="${LIBRARY:-/tmp/graftjax_compose_library}"
templates=0,1,2,4,5,6,8,10,12,13,15,16,19,20,22,23,26,27,28,29,31,32,33,36,37,38,39,41,42,43,44,46,48,49,50,51,53,54,55,56,57,58,60,62,63,64,65,66,68,69,70,71,72,73,75,77,78,79,81,85,86,87,89,90,91,92,93,95,97,98
python experiments/flywheel_compose.py --model=gemma3-270m --dtype=float32 --impl=pallas \
    --templates=$templates --per_template=1 --base_tokens=256 --rows=64 --chunk_size=8 \
    --recall_tokens=16 --solve_tokens=256 --deadline_s=240 --library="$LIBRARY" \
    --out="$OUT/flywheel_compose_${GPU}.json" 2>&1 | tee "$OUT/logs/flywheel_compose_${GPU}.log"
