# The paging study on a GPU, real model, bfloat16, Pallas kernels:
#   bash experiments/device/paging.sh pagein   page-in against re-prefill, 32 to 8,192 tokens
#   bash experiments/device/paging.sh scale    10 to 10,000 pages of 512 tokens of Python
#       source kept as their 3 global layers (5,120,000 tokens, about 16 GB on disk in
#       STORE) behind a 32,768-slot window; resumes a store it finds (pages already
#       catalogued and sizes already measured are skipped)
#   bash experiments/device/paging.sh needle   50 facts planted in one 32k window, routed
#       over the grown store and answered from one page against the base model
#   bash experiments/device/paging.sh needle_topk   the same 50 facts under rope_relative, routed
#       over the needle pages only (the grown store is another model's), answered from the top
#       page and from the top 4 pages composed side by side (PagedContext), against the base model
# Tokenizing the corpus takes a few minutes of CPU; make the plan beforehand on any
# machine with --plan_only and copy STORE/scale_plan.* over to skip it there.
source experiments/device/common.sh
study_out paging
STORE="${STORE:-/tmp/graftjax_paging_store}"
case "${1:-}" in
  pagein)
    python experiments/bench_paging_pagein.py --tokens=32,64,128,256,512,1024,2048,4096,8192 \
        --repeats=5 --recompute_repeats=5 --out="$OUT/paging_pagein_${GPU}.json" ;;
  scale)
    python experiments/paging_scale.py --model=gemma3-270m --dtype=bfloat16 --impl=pallas \
        --page_tokens=512 --local_rows=0 --window_slots=32768 --sizes=10,100,1000,10000 \
        --queries=200 --batch=32 --threads=16 --store="$STORE" \
        --out="$OUT/paging_scale_${GPU}.json" ;;
  needle)
    python experiments/needle.py --model=gemma3-270m --dtype=bfloat16 --impl=pallas \
        --store="$STORE" --needles=50 --page_tokens=512 --pages_per_window=64 \
        --out="$OUT/paging_needle_${GPU}.json" ;;
  needle_topk)
    python experiments/needle.py --model=gemma3-270m --dtype=bfloat16 --impl=pallas \
        --position_scheme=rope_relative --top_k=4 --needles=50 --page_tokens=512 \
        --pages_per_window=64 --out="$OUT/paging_needle_topk4_${GPU}.json" ;;
  *) echo "usage: bash experiments/device/paging.sh pagein|scale|needle|needle_topk" >&2; exit 2 ;;
esac
