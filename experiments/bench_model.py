r"""Speed of the model: prefill and decode tokens/s, float32 and bfloat16.

    python experiments/bench_model.py --llamacpp_python=/path/to/python-with-llama-cpp \
        --out=experiments/results/bench_model_cpu.json
    python experiments/bench_model.py --impl=xla --impl=pallas --prompt_tokens=4096 \
        --decode_tokens=128 --out=experiments/results/bench_model_h200.json

With several --impl, each dtype runs under each kernel set side by side, and
`invariance_cost` gives how much slower the chunk-invariant Pallas kernels
make the model than XLA's (xla tokens/s over pallas tokens/s, minus 1).
`--per_op` adds, per dtype, the XLA model with one op at a time on its Pallas
kernel (`xla+attention=pallas`, ...), and `per_op_cost` the same ratio for
each: where the end-to-end cost of invariance comes from.

`--weights=random` times the --model architecture (gemma-3-270m by
default) with seeded random weights and token ids: the speed does not depend
on the values, and no GGUF is needed (e.g. on a machine the model is not
staged on).

Prefill: --prompt_tokens of standard-library text in chunks of --chunk_size
(timed after a warm-up run that compiles). Decode: --decode_tokens greedy
steps of the jitted while-loop. Beside them, llama.cpp on the same tokens
and machine (another interpreter, llama-cpp-python; its weights stay
Q4_K_M-quantized and its activations are quantized, ours are dequantized
float32/bfloat16, so this compares engines, not equal arithmetic).
"""

from graftjax import determinism

determinism.pin()

import json  # pylint: disable=g-import-not-at-top,wrong-import-position
import math
import os
import pathlib
import subprocess
import tempfile
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from graftjax import ledger
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import gguf as gguf_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import ops
from graftjax.models.gemma import sampler
from graftjax.models.gemma import transformer
from graftjax.studies import cli
from graftjax.studies import corpus
from graftjax.studies import results

_PROMPT_TOKENS = flags.DEFINE_integer('prompt_tokens', 512, 'Prefill length.')
_DECODE_TOKENS = flags.DEFINE_integer('decode_tokens', 32, 'Greedy decode steps.')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 128, 'Prefill chunk.')
_DTYPES = flags.DEFINE_multi_enum(
  'dtype', ['float32', 'bfloat16'], ['float32', 'bfloat16'], 'Dtypes.'
)
_IMPLS = flags.DEFINE_multi_enum('impl', ['xla'], list(config_lib.IMPLS), 'Kernel sets (repeat).')
_PER_OP = flags.DEFINE_bool('per_op', False, 'Also time XLA with each op alone on Pallas.')
_WEIGHTS = flags.DEFINE_enum(
  'weights',
  'real',
  ['real', 'random'],
  'The real GGUF weights, or seeded random ones of the same shapes.',
)
_MODEL = flags.DEFINE_enum(
  'model',
  'gemma3-270m',
  sorted(config_lib.NAMED_CONFIGS),
  'Architecture (--weights=real: gemma3-270m only).',
)
_REPEATS = flags.DEFINE_integer('repeats', 1, 'Timed runs per row; the fastest is kept.')
_LLAMACPP_PYTHON = flags.DEFINE_string(
  'llamacpp_python', None, 'Interpreter with llama-cpp-python.'
)
_OUT = flags.DEFINE_string('out', 'experiments/results/bench_model_cpu.json', 'Result JSON.')


def measure(model, prompt: list[int], *, chunk_size: int, decode_tokens: int, repeats: int) -> dict:
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
  config = config_lib.get_config(name)
  return gemma_model.from_params(config, transformer.init_params(config, seed=0), dtype=dtype)


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


def run(
  *,
  dtypes: list[str],
  impls: list[str],
  per_op: bool = False,
  weights: str = 'real',
  model_name: str = 'gemma3-270m',
  prompt_tokens: int,
  decode_tokens: int,
  chunk_size: int,
  repeats: int = 1,
  llamacpp_python: str | None = None,
  command: str | None = None,
) -> dict:
  """Prefill and decode speed of every dtype under every kernel set; the result.

  Raises:
    ValueError: for per_op without 'xla' in impls, llama.cpp with random weights, or
      real weights of another model than gemma3-270m.
  """
  if weights == 'real' and model_name != 'gemma3-270m':
    raise ValueError(
      f'real weights exist for gemma3-270m only: use --weights=random for {model_name}'
    )
  if per_op and 'xla' not in impls:
    raise ValueError('--per_op compares with the XLA model: add --impl=xla')
  if llamacpp_python and weights == 'random':
    raise ValueError('llama.cpp runs the real GGUF: drop --llamacpp_python or use --weights=real')
  rows = {}
  invariance_cost = {}
  per_op_cost = {}
  prompt = None
  for dtype in dtypes:
    if weights == 'random':
      base = random_model(model_name, jnp.dtype(dtype))
      prompt = random_prompt(base.config, prompt_tokens)
    else:
      base = gemma_model.load('gemma3-270m', dtype=jnp.dtype(dtype))
      if prompt is None:
        prompt = long_prompt(base.tokenizer, prompt_tokens)
    for name, (impl, ops_impl) in kernel_sets(impls, per_op).items():
      row = f'graftjax_{dtype}_{name}'
      rows[row] = measure(
        base.with_impl(impl, **ops_impl),
        prompt,
        chunk_size=chunk_size,
        decode_tokens=decode_tokens,
        repeats=repeats,
      )
      print(dtype, name, rows[row], flush=True)
    xla = rows.get(f'graftjax_{dtype}_xla')
    if xla and 'pallas' in impls:
      invariance_cost[dtype] = slowdown(xla, rows[f'graftjax_{dtype}_pallas'])
    if per_op:
      per_op_cost[dtype] = {
        op: slowdown(xla, rows[f'graftjax_{dtype}_xla+{op}=pallas']) for op in config_lib.OPS
      }
  if llamacpp_python:
    with tempfile.TemporaryDirectory() as tmp:
      path = pathlib.Path(tmp) / 'tokens.json'
      path.write_text(json.dumps(prompt))
      script = pathlib.Path(__file__).parent / 'peers' / 'llamacpp_speed.py'
      proc = subprocess.run(
        [
          llamacpp_python,
          str(script),
          str(gguf_lib.locate_gguf()),
          str(path),
          str(os.cpu_count()),
          str(decode_tokens),
        ],
        capture_output=True,
        text=True,
        check=True,
      )
    rows['llamacpp'] = json.loads(proc.stdout.strip().splitlines()[-1])
    print('llama.cpp', rows['llamacpp'])
  inputs = {
    'sha256_prompt_ids': ledger.sha256_tokens(prompt),
    **(
      {'gguf_sha256': gguf_lib.expected_sha256()}
      if weights == 'real'
      else {'config': model_name, 'random_weights_seed': 0}
    ),
  }
  return {
    **results.header('bench_model', inputs=inputs, command=command),
    'cpu_count': os.cpu_count(),
    'prompt_tokens': len(prompt),
    'decode_tokens': decode_tokens,
    'chunk_size': chunk_size,
    'weights': weights,
    'repeats': repeats,
    'impls': list(impls),
    'rows': rows,
    'invariance_cost': invariance_cost,
    **({'per_op_cost': per_op_cost} if per_op else {}),
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    result = run(
      dtypes=_DTYPES.value,
      impls=_IMPLS.value,
      per_op=_PER_OP.value,
      weights=_WEIGHTS.value,
      model_name=_MODEL.value,
      prompt_tokens=_PROMPT_TOKENS.value,
      decode_tokens=_DECODE_TOKENS.value,
      chunk_size=_CHUNK_SIZE.value,
      repeats=_REPEATS.value,
      llamacpp_python=_LLAMACPP_PYTHON.value,
    )
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
