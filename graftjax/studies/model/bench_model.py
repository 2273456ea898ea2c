"""Speed of the model: prefill and decode tokens/s per dtype and kernel set.

The library of experiments/bench_model.py. `experiment(...)` times every dtype under every
kernel set (and, `per_op`, XLA with one op at a time on Pallas), the cost of invariance as a
ratio, and optionally llama.cpp on the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
import json
import math
import os
import pathlib
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from graftjax import ledger
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import gguf as gguf_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import ops
from graftjax.models.gemma import sampler
from graftjax.studies.common import corpus
from graftjax.studies.common import results

# llama.cpp's side of the comparison, run by another interpreter.
PEERS = pathlib.Path(__file__).resolve().parents[3] / 'experiments' / 'peers'


def phases(model, prompt: list[int], *, chunk_size: int, decode_tokens: int):
  """(prefill, decode): prefill() -> (last logits, cache) of the prompt in chunks;
  decode(last, cache) -> `decode_tokens` greedy steps of the jitted while-loop."""
  multiple = math.lcm(chunk_size, ops.CAPACITY_MULTIPLE)  # Pallas attention's KV tiles
  capacity = -(-(len(prompt) + decode_tokens) // multiple) * multiple

  def prefill():
    last, cache = model.prefill(
      prompt, cache=model.init_cache(capacity=capacity), chunk_size=chunk_size, logits='last'
    )
    return jax.block_until_ready((last, cache))

  def decode(last, cache):
    out = sampler.decode(
      model.params,
      last,
      jnp.full((1,), len(prompt), jnp.int32),
      cache,
      jax.random.key(0),
      config=model.config,
      max_new_tokens=decode_tokens,
      tables=model.tables,
    )
    return jax.block_until_ready(out)

  return prefill, decode


def measure(model, prompt: list[int], *, chunk_size: int, decode_tokens: int, repeats: int) -> dict:
  prefill, decode = phases(model, prompt, chunk_size=chunk_size, decode_tokens=decode_tokens)
  decode(*prefill())  # compile both
  prefill_s = decode_s = float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    last, cache = prefill()
    prefill_s = min(prefill_s, time.perf_counter() - t0)
    t0 = time.perf_counter()
    decode(last, cache)
    decode_s = min(decode_s, time.perf_counter() - t0)
  return {
    'prefill_tokens_per_s': len(prompt) / prefill_s,
    'decode_tokens_per_s': decode_tokens / decode_s,
  }


def random_model(name: str, dtype) -> gemma_model.Gemma:
  """The named architecture with seeded random weights (timing only)."""
  return gemma_model.load(name, weights='random', seed=0, dtype=dtype)


def random_prompt(config: config_lib.GemmaConfig, n: int) -> list[int]:
  ids = np.random.default_rng(0).integers(3, config.vocab_size, size=n - 1)
  return [config.bos_id] + ids.tolist()


def kernel_sets(impls: list[str], per_op: bool) -> dict[str, tuple[str, dict[str, str]]]:
  """Row name -> `with_impl` arguments: each of `impls`, then (per_op) XLA with one op on Pallas."""
  sets = {impl: (impl, {}) for impl in impls}
  if per_op:
    sets.update({f'xla+{op}=pallas': ('xla', {op: 'pallas'}) for op in config_lib.OPS})
  return sets


def slowdown(base: dict, other: dict) -> dict:
  """base tokens/s over other tokens/s, minus 1, for prefill and decode."""
  return {k: base[k] / other[k] - 1 for k in base}


def long_prompt(tokenizer, n: int) -> list[int]:
  """The first n tokens (BOS included) of standard-library sources, concatenated."""
  ids = []
  for path in corpus.stdlib_files():
    ids += tokenizer.encode(path.read_text(encoding='utf-8', errors='replace'), add_bos=not ids)
    if len(ids) >= n:
      return ids[:n]
  raise ValueError(f'the standard library holds fewer than {n} tokens')


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `experiment` runs (experiments/bench_model.py builds it from its flags): its
  arguments, as its docstring describes them."""

  dtypes: list[str]
  impls: list[str]
  prompt_tokens: int
  decode_tokens: int
  chunk_size: int
  per_op: bool = False
  weights: str = 'real'
  model_name: str = 'gemma3-270m'
  repeats: int = 1
  dot_precision: str = 'highest'
  llamacpp_python: str | None = None


def experiment(
  settings: Settings,
  *,
  command: str | None = None,
  log: Callable[[str], None] = functools.partial(print, flush=True),
) -> dict:
  """Prefill and decode speed of every dtype under every kernel set; the result.

  Every kernel set, XLA's too, computes float32 products at `dot_precision`
  (`GemmaConfig.dot_precision`).

  Raises:
    ValueError: for per_op without 'xla' in impls, llama.cpp with random weights or a
      checkpoint folder, real weights of a config other than gemma3-270m, or random weights
      of a folder.
  """
  folder = (
    os.path.isdir(settings.model_name) and settings.model_name not in config_lib.NAMED_CONFIGS
  )
  if settings.weights == 'real' and not folder and settings.model_name != 'gemma3-270m':
    raise ValueError(
      f'real weights ship for gemma3-270m only: use --weights=random for {settings.model_name}'
      ' or pass a checkpoint folder'
    )
  if settings.weights == 'random' and folder:
    raise ValueError(
      f'--weights=random times a config by name, not the folder {settings.model_name}'
    )
  if settings.llamacpp_python and folder:
    raise ValueError("llama.cpp runs gemma3-270m's GGUF: drop --llamacpp_python for a folder")
  if settings.per_op and 'xla' not in settings.impls:
    raise ValueError('--per_op compares with the XLA model: add --impl=xla')
  if settings.llamacpp_python and settings.weights == 'random':
    raise ValueError('llama.cpp runs the real GGUF: drop --llamacpp_python or use --weights=real')
  rows = {}
  invariance_cost = {}
  per_op_cost = {}
  prompt = None
  for dtype in settings.dtypes:
    if settings.weights == 'random':
      base = random_model(settings.model_name, jnp.dtype(dtype))
      prompt = random_prompt(base.config, settings.prompt_tokens)
    else:
      base = gemma_model.load_named(settings.model_name, dtype=jnp.dtype(dtype))
      if base.tokenizer is None:
        raise ValueError(f'{settings.model_name} has no tokenizer to encode the prompt with')
      if prompt is None:
        prompt = long_prompt(base.tokenizer, settings.prompt_tokens)
    base = base.with_dot_precision(settings.dot_precision)
    for name, (impl, ops_impl) in kernel_sets(settings.impls, settings.per_op).items():
      row = f'graftjax_{dtype}_{name}'
      rows[row] = measure(
        base.with_impl(impl, **ops_impl),
        prompt,
        chunk_size=settings.chunk_size,
        decode_tokens=settings.decode_tokens,
        repeats=settings.repeats,
      )
      log(f'{dtype} {name} {rows[row]}')
    xla = rows.get(f'graftjax_{dtype}_xla')
    if xla and 'pallas' in settings.impls:
      invariance_cost[dtype] = slowdown(xla, rows[f'graftjax_{dtype}_pallas'])
    if settings.per_op:
      per_op_cost[dtype] = {
        op: slowdown(xla, rows[f'graftjax_{dtype}_xla+{op}=pallas']) for op in config_lib.OPS
      }
  if settings.llamacpp_python:
    with tempfile.TemporaryDirectory() as tmp:
      path = pathlib.Path(tmp) / 'tokens.json'
      path.write_text(json.dumps(prompt))
      script = PEERS / 'llamacpp_speed.py'
      proc = subprocess.run(
        [
          settings.llamacpp_python,
          str(script),
          str(gguf_lib.locate_gguf()),
          str(path),
          str(os.cpu_count()),
          str(settings.decode_tokens),
        ],
        capture_output=True,
        text=True,
        check=True,
      )
    rows['llamacpp'] = json.loads(proc.stdout.strip().splitlines()[-1])
    log(f'llama.cpp {rows["llamacpp"]}')
  inputs = {
    'sha256_prompt_ids': ledger.sha256_tokens(prompt),
    **(
      results.model_inputs(base, settings.model_name)
      if settings.weights == 'real'
      else {'config': settings.model_name, 'random_weights_seed': 0}
    ),
  }
  return {
    **results.header('bench_model', inputs=inputs, command=command),
    'cpu_count': os.cpu_count(),
    'prompt_tokens': len(prompt),
    'decode_tokens': settings.decode_tokens,
    'chunk_size': settings.chunk_size,
    'weights': settings.weights,
    'repeats': settings.repeats,
    'dot_precision': settings.dot_precision,
    'impls': list(settings.impls),
    'rows': rows,
    'invariance_cost': invariance_cost,
    # Pallas matmul calls of <= 16 rows: the decode kernel's variant, or None (prefill kernel).
    'matmul_decode': {dtype: ops.matmul_decode_variant(dtype) for dtype in settings.dtypes},
    **({'per_op_cost': per_op_cost} if settings.per_op else {}),
  }
