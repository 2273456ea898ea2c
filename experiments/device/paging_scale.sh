# The paged store at scale on the H200 (issue 13, items 5 and 7): the real
# model in bfloat16 with the chunk-invariant Pallas kernels (installs into the
# 32,768-slot window are byte-exact), pages of 512 tokens of Python source
# (stdlib incl. tests, then site-packages) kept as their 3 global layers
# (--local_rows=0: ~3 KB/token on disk), grown to 10, 100, 1,000 and 10,000
# pages = 5,120,000 tokens (156x the window, ~16 GB on disk). Run after the
# six model parts are staged (docs/device.md), each call under 10 minutes:
#
#   bash experiments/device/paging_scale.sh          # repeat until it prints COMPLETE
#   bash experiments/device/paging_scale.sh needle   # then, in a call of its own
#
# Each scale call grows the store at /root/paging_store for at most
# DEADLINE_S seconds from the start of the experiment (the first call also
# tokenizes the corpus, ~2-3 minutes, and saves the plan there), measures every
# size it reaches, and copies the result (partial until complete) and its plot
# to $OUT. Pages already catalogued and sizes already measured are skipped, so
# calls resume one another while the machine stays warm (/root goes with it;
# a cold machine starts over). The needle call asks 50 facts planted in one
# 32k window (64 pages of 512 tokens) paged against the base model given that
# window.
source experiments/device/setup.sh
if [ "$1" = needle ]; then
  timeout 540 python3 experiments/needle.py --model=gemma3-270m --dtype=bfloat16 --needles=50 \
      --page_tokens=512 --pages_per_window=64 --out="$OUT/paging_needle_h200.json" 2>&1 \
      | grep -v '%|' | tail -3
  exit 0
fi
DEADLINE_S=${DEADLINE_S:-400}
timeout 540 python3 experiments/paging_scale.py --model=gemma3-270m --dtype=bfloat16 \
    --impl=pallas --page_tokens=512 --local_rows=0 --window_slots=32768 \
    --sizes=10,100,1000,10000 --queries=200 --threads=16 --store=/root/paging_store \
    --deadline_s="$DEADLINE_S" --out=/root/paging_scale_h200.json 2>&1 | grep -v '%|' | tail -12
cp /root/paging_scale_h200.json /root/paging_scale_h200.png "$OUT/" 2>/dev/null
df -h /root | tail -1
if python3 -c "import json,sys; sys.exit(not json.load(open('/root/paging_scale_h200.json'))['summary']['complete'])"; then
  echo COMPLETE
else
  echo 'INCOMPLETE: run again'
fi
