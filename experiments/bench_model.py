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

`--weights=random` times the --config architecture (gemma-3-270m by
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
import shlex
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from graftjax.studies import corpus
from graftjax import ledger
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import gguf as gguf_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import ops
from graftjax.models.gemma import sampler
from graftjax.models.gemma import transformer

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
_CONFIG = flags.DEFINE_enum(
  'config', 'gemma3-270m', sorted(config_lib.NAMED_CONFIGS), 'Architecture of --weights=random.'
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


def kernel_sets() -> dict[str, tuple[str, dict[str, str]]]:
  """Row name -> `with_impl` arguments, for the kernel sets the flags ask for."""
  sets = {impl: (impl, {}) for impl in _IMPLS.value}
  if _PER_OP.value:
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if _PER_OP.value and 'xla' not in _IMPLS.value:
    raise app.UsageError('--per_op compares with the XLA model: add --impl=xla')
  if _LLAMACPP_PYTHON.value and _WEIGHTS.value == 'random':
    raise app.UsageError(
      'llama.cpp runs the real GGUF: drop --llamacpp_python or use --weights=real'
    )
  rows = {}
  invariance_cost = {}
  per_op_cost = {}
  prompt = None
  for dtype in _DTYPES.value:
    if _WEIGHTS.value == 'random':
      base = random_model(_CONFIG.value, jnp.dtype(dtype))
      prompt = random_prompt(base.config, _PROMPT_TOKENS.value)
    else:
      base = gemma_model.load('gemma3-270m', dtype=jnp.dtype(dtype))
      if prompt is None:
        prompt = long_prompt(base.tokenizer, _PROMPT_TOKENS.value)
    for name, (impl, per_op) in kernel_sets().items():
      row = f'graftjax_{dtype}_{name}'
      rows[row] = measure(
        base.with_impl(impl, **per_op),
        prompt,
        chunk_size=_CHUNK_SIZE.value,
        decode_tokens=_DECODE_TOKENS.value,
        repeats=_REPEATS.value,
      )
      print(dtype, name, rows[row], flush=True)
    xla = rows.get(f'graftjax_{dtype}_xla')
    if xla and 'pallas' in _IMPLS.value:
      invariance_cost[dtype] = slowdown(xla, rows[f'graftjax_{dtype}_pallas'])
    if _PER_OP.value:
      per_op_cost[dtype] = {
        op: slowdown(xla, rows[f'graftjax_{dtype}_xla+{op}=pallas']) for op in config_lib.OPS
      }
  if _LLAMACPP_PYTHON.value:
    with tempfile.TemporaryDirectory() as tmp:
      path = pathlib.Path(tmp) / 'tokens.json'
      path.write_text(json.dumps(prompt))
      script = pathlib.Path(__file__).parent / 'peers' / 'llamacpp_speed.py'
      proc = subprocess.run(
        [
          _LLAMACPP_PYTHON.value,
          str(script),
          str(gguf_lib.locate_gguf()),
          str(path),
          str(os.cpu_count()),
          str(_DECODE_TOKENS.value),
        ],
        capture_output=True,
        text=True,
        check=True,
      )
    rows['llamacpp'] = json.loads(proc.stdout.strip().splitlines()[-1])
    print('llama.cpp', rows['llamacpp'])
  result = {
    'experiment': 'bench_model',
    'command': shlex.join(['python'] + sys.argv),
    'determinism': determinism.record(),
    'cpu_count': os.cpu_count(),
    'prompt_tokens': len(prompt),
    'decode_tokens': _DECODE_TOKENS.value,
    'chunk_size': _CHUNK_SIZE.value,
    'weights': _WEIGHTS.value,
    'repeats': _REPEATS.value,
    'inputs': {
      'sha256_prompt_ids': ledger.sha256_tokens(prompt),
      **(
        {'gguf_sha256': gguf_lib.expected_sha256()}
        if _WEIGHTS.value == 'real'
        else {'config': _CONFIG.value, 'random_weights_seed': 0}
      ),
    },
    'impls': _IMPLS.value,
    'rows': rows,
    'invariance_cost': invariance_cost,
    **({'per_op_cost': per_op_cost} if _PER_OP.value else {}),
  }
  print(f'wrote {_OUT.value} (sha256 {ledger.write_result(_OUT.value, result)})')


if __name__ == '__main__':
  app.run(main)
