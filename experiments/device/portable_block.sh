# A block moved between two GPUs of one architecture (H100 and H200 are both Hopper),
# Pallas kernels, bfloat16, 512 tokens grafted (gemma3-270m: a 9.4 MB block, one small file
# to copy between machines), 32 processed after:
#   bash experiments/device/portable_block.sh deposit
#       deposits on this GPU into $OUT/portable_block_${GPU}/ (store.tar, deposit.json);
#       bring that folder to the other machine
#   bash experiments/device/portable_block.sh graft DIR
#       grafts DIR's block on this GPU (every byte verified) and writes
#       $OUT/portable_block_<from>_to_${GPU}.json: whether the grafted logits equal this
#       GPU's fresh ones, and the depositing GPU's; prints the answer in one sentence
# MODEL (default gemma3-270m; e.g. gemma3-1b:random needs no checkpoint) must be the same on
# both machines: the graft refuses a block of another model.
source experiments/device/common.sh
study_out store_sync
MODEL="${MODEL:-gemma3-270m}"
run() {
  python experiments/portable_block.py --model="$MODEL" --dtype=bfloat16 --impl=pallas "$@"
}
case "${1:-}" in
  deposit)
    run --mode=deposit --prefix_tokens=512 --continuation_tokens=32 --chunk_size=64 \
        --dir="$OUT/portable_block_${GPU}" ;;
  graft)
    DIR="${2:?usage: bash experiments/device/portable_block.sh graft DIR}"
    FROM=$(basename "$DIR" | sed 's/^portable_block_//')
    run --mode=graft --dir="$DIR" --out="$OUT/portable_block_${FROM}_to_${GPU}.json" ;;
  *) echo "usage: bash experiments/device/portable_block.sh deposit | graft DIR" >&2; exit 2 ;;
esac
