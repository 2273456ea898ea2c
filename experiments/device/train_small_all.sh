# Issue 4 on the H200, meant to run in the background (setsid) while other
# calls go on: trains the small (few-million-parameter) byte-level models
# under rope, alibi and nope, then sweeps relocation on each. Everything
# lands in /root/results/small; `DONE` marks the end, `small.tar` holds the
# result files (the checkpoints stay in /root/ckpt).
source experiments/device/env.sh
set +e
R=/root/results/small
mkdir -p "$R"
for s in rope alibi nope; do
  python3 experiments/train_small.py --scheme=$s --model=small --steps=2000 \
      --out=/root/ckpt/small_$s --overwrite > "$R/train_$s.log" 2>&1
  cp /root/ckpt/small_$s/model.json "$R/trained_small_${s}_model.json"
done
for s in rope alibi nope; do
  schemes="--scheme=$s"
  if [ $s = rope ]; then schemes="--scheme=rope --scheme=rope_relative"; fi
  python3 experiments/relocation.py --model=/root/ckpt/small_$s $schemes \
      --dtype=float32 --dtype=bfloat16 --samples=3 \
      --out="$R/relocation_trained_small_$s.json" > "$R/relocation_$s.log" 2>&1
done
(cd "$R" && tar cf /root/results/small.tar *.json *.png *.log)
touch "$R/DONE"
