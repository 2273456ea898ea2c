# The invariance experiment over a cache of several attention splits (a
# 992-token prefix: capacity 1024 = 4 float32 splits of 256 slots, 2 bfloat16
# splits of 512), in both dtypes, on the H200 after the model parts are
# staged; meant to run in the background (setsid). Five shards of two samples
# per dtype, side by side; results land in /root/out3, `DONE_LONG` marks the
# end. Merge with `python experiments/invariance.py --merge=...`.
source experiments/device/setup.sh
set +e
R=/root/out3
mkdir -p "$R"
source experiments/device/shards.sh
invariance_long_shards "$R"
wait
touch "$R/DONE_LONG"
