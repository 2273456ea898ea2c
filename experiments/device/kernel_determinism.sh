# The kernel determinism study on a GPU: every Pallas kernel in both dtypes and
# the real model's logits, digested in three processes, then merged (the runs
# stay in runs/). Needs the real model.
source experiments/device/common.sh
study_out kernel_determinism
runs=()
for label in a b c; do
  python experiments/kernel_determinism.py --label=run_$label \
      --out="$OUT/runs/kernel_determinism_${GPU}_$label.json"
  runs+=("$OUT/runs/kernel_determinism_${GPU}_$label.json")
done
python experiments/kernel_determinism.py --merge="$(IFS=,; echo "${runs[*]}")" \
    --out="$OUT/kernel_determinism_${GPU}.json"
