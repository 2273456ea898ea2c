# The relocation study's trained models on a GPU: small (about 5.8M-parameter)
# byte-level models trained under rope, alibi and nope, then the relocation
# sweep on each. Checkpoints go to CKPT (default /tmp/graftjax_small).
source experiments/device/common.sh
study_out relocation
CKPT="${CKPT:-/tmp/graftjax_small}"
for s in rope alibi nope; do
  python experiments/train_small.py --scheme=$s --model=small --steps=2000 \
      --out="$CKPT/small_$s" --overwrite > "$OUT/logs/small_train_$s.log" 2>&1
  cp "$CKPT/small_$s/model.json" "$OUT/trained_small_${s}_model.json"
done
for s in rope alibi nope; do
  schemes="--scheme=$s"
  if [ $s = rope ]; then schemes="--scheme=rope --scheme=rope_relative"; fi
  python experiments/relocation.py --model="$CKPT/small_$s" $schemes \
      --dtype=float32 --dtype=bfloat16 --samples=3 \
      --out="$OUT/relocation_trained_small_$s.json" > "$OUT/logs/small_relocation_$s.log" 2>&1
done
