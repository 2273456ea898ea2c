# Issue 14, exploration 2 on the H200 (no model). About 7 minutes.
# 1. bench_matmul_tiles: decode (1 row) and prefill (128 rows) candidates, both dtypes.
# 2. bench_model bfloat16 (xla, pallas) under three command-buffer settings.
# 3. bench_attention_tiles: bfloat16 decode with the combine's launch knobs.
source experiments/device/env.sh
set +e
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/log.txt"; }
M1="16,32,64,4,3 16,64,64,4,3 16,128,64,4,3 16,32,128,4,3 16,64,128,4,3 16,128,128,4,3 16,64,256,4,3 16,64,64,4,4 16,64,64,2,3 16,256,64,4,3"
M128="64,128,64,4,3 128,128,64,8,3 64,64,128,4,3 64,128,128,4,3 128,64,64,4,3 128,128,64,4,3 64,256,64,8,3 128,256,64,8,3 64,64,64,4,4"
for dtype in bfloat16 float32; do
  timeout 100 python experiments/bench_matmul_tiles.py --time_budget_s=85 --dtype=$dtype --rows=1 \
    $(for c in $M1; do echo --candidate=$c; done) \
    --out="$OUT/bench_matmul_tiles_h200_${dtype}_rows1.json" > "$OUT/mt_${dtype}_1.log" 2>&1
  say "matmul tiles $dtype rows=1 exit $?"
  timeout 100 python experiments/bench_matmul_tiles.py --time_budget_s=85 --dtype=$dtype --rows=128 \
    --shape=q --shape=kv --shape=o --shape=gate_up --shape=down \
    $(for c in $M128; do echo --candidate=$c; done) \
    --out="$OUT/bench_matmul_tiles_h200_${dtype}_rows128.json" > "$OUT/mt_${dtype}_128.log" 2>&1
  say "matmul tiles $dtype rows=128 exit $?"
done
for cb in default off all; do
  case $cb in
    default) F="" ;;
    off) F="--xla_gpu_enable_command_buffer=" ;;
    all) F="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN --xla_gpu_graph_min_graph_size=1" ;;
  esac
  XLA_FLAGS="$F" timeout 70 python experiments/bench_model.py --weights=random --impl=xla --impl=pallas \
    --dtype=bfloat16 --prompt_tokens=1024 --decode_tokens=64 --chunk_size=128 --repeats=3 \
    --out="$OUT/bench_model_h200_bfloat16_cmdbuf_$cb.json" > "$OUT/cmdbuf_$cb.log" 2>&1
  say "command buffers $cb exit $?: $(grep -E 'bfloat16 (xla|pallas)' "$OUT/cmdbuf_$cb.log" | tr '\n' ' ')"
done
A="4,64,512,4,2,1,8,64 4,64,512,4,2,1,8,16 4,64,512,4,2,1,16,32 4,64,256,4,3,2,8,16 4,64,256,4,3,1,16,16 4,64,256,4,3,1,32,16 4,128,512,4,2,1,8,16 4,64,128,4,3,1,16,16"
timeout 90 python experiments/bench_attention_tiles.py --time_budget_s=75 --prefill_lengths= \
  --float32=4,32,256,4 $(for c in $A; do echo --bfloat16=$c; done) \
  --out="$OUT/bench_attention_tiles_h200_combine.json" > "$OUT/attention_tiles.log" 2>&1
say "attention tiles exit $?"
