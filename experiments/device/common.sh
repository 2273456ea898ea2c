# Sourced by every script here. Needs graftjax installed with a CUDA jax
# (`pip install -e '.[cuda12,model]'`, docs/device.md) and one visible GPU.
# OUT is the study folder the results go to (default: the committed one, so a
# re-run replaces the committed files; regenerate the page afterwards with
# `python experiments/results_page.py`).
set -euo pipefail
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/graftjax/jax}"
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' || {
  echo "jax sees no GPU: install the CUDA plugin, pip install -e '.[cuda12]'" >&2
  exit 2
}
study_out() { OUT="${OUT:-experiments/results/$1}"; mkdir -p "$OUT/runs" "$OUT/logs"; }
