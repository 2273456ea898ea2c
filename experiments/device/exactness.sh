# The exactness study on a GPU: a 1,024-token prefix grafted back at its own
# position, 50 samples in float32 and bfloat16, against a fresh prefill.
# Needs the real model. Writes exactness_${GPU}.json and its table.
source experiments/device/common.sh
study_out exactness
python experiments/exactness.py --model=gemma3-270m --samples=50 --dtype=float32 \
    --dtype=bfloat16 --out="$OUT/exactness_${GPU}.json"
