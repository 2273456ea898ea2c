# Sourced by every script here. Needs graftjax installed with a CUDA jax
# (`pip install -e '.[cuda12,model]'`, docs/device.md) and one visible GPU.
# OUT is the study folder the results go to (default: the committed one, so a
# re-run replaces the committed files; regenerate the page afterwards with
# `python experiments/results_page.py`).
set -euo pipefail
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/graftjax/jax}"
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# GPU names the result files by the device: h200 on an NVIDIA H200, h100 on an
# H100 (the first word of the device kind with a digit in it).
GPU=$(python -c '
import re, sys, jax
if jax.default_backend() != "gpu":
  sys.exit("jax sees no GPU: install the CUDA plugin, pip install -e .[cuda12]")
words = re.split(r"[\s_-]+", jax.devices()[0].device_kind.lower())
print(next((w for w in words if re.search(r"\d", w)), "gpu"))
')
study_out() { OUT="${OUT:-experiments/results/$1}"; mkdir -p "$OUT/runs" "$OUT/logs"; }
