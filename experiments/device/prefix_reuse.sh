# The prefix-reuse workloads on a GPU at scale: seeded random weights of Gemma 3 12B and
# Gemma 4 31B in bfloat16, every op on the Pallas kernels (chunk-invariant: hits end at any
# token, and every request's logits must equal a cold prefill's byte for byte). Random weights
# carry a byte tokenizer, so prompts are longer in tokens than with the real vocabulary.
# Writes prefix_reuse_<model>_${GPU}.json per model.
#   bash experiments/device/prefix_reuse.sh            (both models)
#   MODELS=gemma3-12b bash experiments/device/prefix_reuse.sh
source experiments/device/common.sh
study_out prefix_reuse
for model in ${MODELS:-gemma3-12b gemma4-31b}; do
  python experiments/prefix_reuse.py --model="$model:random" --dtype=bfloat16 --impl=pallas \
      --span=256 --chunk_size=256 --capacity=16384 --fewshot=8 --turns=6 \
      --document_tokens=8192 --questions=8 --anchor_grid=1024 \
      --out="$OUT/prefix_reuse_${model}_${GPU}.json" 2>&1 | tee "$OUT/logs/prefix_reuse_${model}_${GPU}.log"
done
