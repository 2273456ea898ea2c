# The graft_speed study on a GPU: for prefixes of 1,024 to 32,768 tokens, a
# stored block restored five times through pinned staging and timed by stage
# against its read and copy floors, and the first token against recomputing
# the prefix (logits compared byte for byte). float32. Needs the real model.
source experiments/device/common.sh
study_out graft_speed
python experiments/bench_graft.py --prefix_tokens=1024,2048,4096,8192,16384,32768 --repeats=5 \
    --out="$OUT/bench_graft_${GPU}.json" 2>&1 | tee "$OUT/logs/restore_${GPU}.log"
