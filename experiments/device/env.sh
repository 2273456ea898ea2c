# Sourced at the start of a device (H200) command that needs no model:
# installs the three wheels the GPU image lacks (carried in .whl), installs
# graftjax editable without network, and sets the run environment.
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null
export JAX_COMPILATION_CACHE_DIR=/root/jaxcache
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
