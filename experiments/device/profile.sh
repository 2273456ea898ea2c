# The profile study on a GPU: the device kernels of one prefill and one decode,
# XLA and Pallas, from a jax trace. Seeded random weights; no model needed.
source experiments/device/common.sh
study_out profile
python experiments/profile_model.py --dtype=bfloat16 --impl=xla --impl=pallas --top=40 \
    --out="$OUT/profile_model_${GPU}_bfloat16.json"
