# Composition of routed library blocks on the H200 (issue 12, item 5): the GSM8K
# items of the 70 GSM-Symbolic templates of flywheel.sh deposited (the base
# model's greedy 256-token attempt where it verifies, else the dataset's
# reference solution), float32, rope_relative, Pallas kernels (native here).
# Each item is asked again after its own block and 0-2 routed distractors:
# logits against a fresh block-attention prefill (packed and shifted by a
# page), and the answers; one new instance per template (never deposited) is
# answered after the top-1 and the top-3 routed blocks (256 tokens).
# Prefill chunks of 8 tokens keep the compiled shapes few (each remainder
# length is a program). Questions stop 240 s after the model starts loading
# (recall and held-out alternate; the result counts what was not asked), so
# the call takes ~5 minutes after staging, 5.5 at most (timeout 330 s). The
# library (/root/compose_library) and the compilation cache persist while the
# machine stays warm: if the first call leaves questions unasked, a second
# call skips the deposits and most compiles and asks them all.
#
#   bash experiments/device/compose.sh
#
# Writes $OUT/flywheel_compose_h200.json and $OUT/flywheel_compose_h200.log.
source experiments/device/setup.sh
templates=0,1,2,4,5,6,8,10,12,13,15,16,19,20,22,23,26,27,28,29,31,32,33,36,37,38,39,41,42,43,44,46,48,49,50,51,53,54,55,56,57,58,60,62,63,64,65,66,68,69,70,71,72,73,75,77,78,79,81,85,86,87,89,90,91,92,93,95,97,98
rc=0
timeout 330 python3 experiments/compose.py --model=gemma3-270m --dtype=float32 --impl=pallas \
    --templates=$templates --per_template=1 --base_tokens=256 --rows=64 \
    --chunk_size=8 --recall_tokens=16 --solve_tokens=256 --deadline_s=240 --library=/root/compose_library \
    --out="$OUT/flywheel_compose_h200.json" > "$OUT/flywheel_compose_h200.log" 2>&1 || rc=$?
grep -v '%|' "$OUT/flywheel_compose_h200.log" | tail -25
echo "exit status $rc"
exit $rc
