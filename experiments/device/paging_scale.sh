# The paged store at scale on the H200 (issue 13, items 5 and 7): the real
# model in bfloat16 with the chunk-invariant Pallas kernels (installs into the
# 32,768-slot window are byte-exact), pages of 512 tokens of Python source
# (stdlib incl. tests, then site-packages) kept as their 3 global layers
# (--local_rows=0: ~3 KB/token on disk), grown to 10, 100, 1,000 and 10,000
# pages = 5,120,000 tokens (156x the window, ~16 GB on disk), prefilled 32
# pages at a time (byte-equal to one at a time under these kernels). Run after
# the six model parts are staged (docs/device.md), each call under 10 minutes:
#
#   # here, once: tokenize the corpus into the plan (a few minutes of CPU)
#   python experiments/paging_scale.py --model=gemma3-270m --dtype=bfloat16 --impl=pallas \
#       --page_tokens=512 --sizes=10,100,1000,10000 --store=.model/plan_store --plan_only
#   bash experiments/device/paging_scale.sh          # carry .whl and .model/plan_store;
#                                                    # repeat until it prints COMPLETE
#   bash experiments/device/paging_scale.sh needle   # then, in a call of its own
#
# Each scale call grows the store at /root/paging_store for at most
# DEADLINE_S seconds from the start of the experiment (from the carried plan,
# or tokenizing the corpus there, ~2-3 minutes, when none was carried),
# measures every size it reaches, and copies the result (partial until
# complete) and its plot to $OUT. Pages already catalogued and sizes already
# measured are skipped, so calls resume one another while the machine stays
# warm (/root goes with it; a cold machine starts over). The needle call plants
# 50 facts in one 32k window (64 pages of 512 tokens), adds those pages to the
# grown store, routes every question over all of it, and answers paged against
# the base model given that window.
source experiments/device/setup.sh
if [ "$1" = needle ]; then
  timeout 540 python3 experiments/needle.py --model=gemma3-270m --dtype=bfloat16 --impl=pallas \
      --store=/root/paging_store --needles=50 --page_tokens=512 --pages_per_window=64 \
      --out="$OUT/paging_needle_h200.json" > "$OUT/needle.log" 2>&1 || echo "needle exited $?"
  grep -v '%|' "$OUT/needle.log" | tail -4
  exit 0
fi
if [ -d .model/plan_store ] && [ ! -f /root/paging_store/scale_plan.json ]; then
  mkdir -p /root/paging_store && cp .model/plan_store/scale_plan.* /root/paging_store/
fi
DEADLINE_S=${DEADLINE_S:-400}
timeout 540 python3 experiments/paging_scale.py --model=gemma3-270m --dtype=bfloat16 \
    --impl=pallas --page_tokens=512 --local_rows=0 --window_slots=32768 \
    --sizes=10,100,1000,10000 --queries=200 --batch=32 --threads=16 --store=/root/paging_store \
    --deadline_s="$DEADLINE_S" --out=/root/paging_scale_h200.json >> "$OUT/scale.log" 2>&1 \
    || echo "paging_scale exited $?"
grep -v '%|' "$OUT/scale.log" | tail -12
cp /root/paging_scale_h200.json /root/paging_scale_h200.png "$OUT/" 2>/dev/null || true
df -h /root | tail -1
if python3 -c "import json,sys; sys.exit(not json.load(open('/root/paging_scale_h200.json'))['summary']['complete'])"; then
  echo COMPLETE
else
  echo 'INCOMPLETE: run again'
fi
