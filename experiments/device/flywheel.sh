# The flywheel study on a GPU with energy (NVML): GSM8K items of the 70
# GSM-Symbolic templates that generate in seconds (the other 30 enumerate for
# minutes), two held-out instances each, four base attempts of 256 tokens per
# item. Needs the real model; the library goes to LIBRARY.
source experiments/device/common.sh
study_out flywheel
LIBRARY="${LIBRARY:-/tmp/graftjax_flywheel_library}"
templates=0,1,2,4,5,6,8,10,12,13,15,16,19,20,22,23,26,27,28,29,31,32,33,36,37,38,39,41,42,43,44,46,48,49,50,51,53,54,55,56,57,58,60,62,63,64,65,66,68,69,70,71,72,73,75,77,78,79,81,85,86,87,89,90,91,92,93,95,97,98
python experiments/flywheel.py --templates=$templates --per_template=2 --samples=4 \
    --max_new_tokens=256 --recall_tokens=16 --rows=64 --energy --library="$LIBRARY" \
    --out="$OUT/flywheel_gsm8k_${GPU}.json" 2>&1 | tee "$OUT/logs/flywheel_gsm8k_${GPU}.log"
