r"""Speed of the real model: prefill and decode tokens/s, float32 and bfloat16.

    python experiments/bench_model.py --llamacpp_python=/path/to/python-with-llama-cpp \
        --out=experiments/results/bench_model_cpu.json
    python experiments/bench_model.py --impl=xla --impl=pallas --prompt_tokens=4096 \
        --decode_tokens=128 --out=experiments/results/bench_model_h200.json

With several --impl, each dtype runs under each kernel set side by side, and
`invariance_cost` gives how much slower the chunk-invariant Pallas kernels
make the model than XLA's (xla tokens/s over pallas tokens/s, minus 1).

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

from graftjax import corpus
from graftjax import ledger
from graftjax.models.gemma import gguf as gguf_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import sampler

_PROMPT_TOKENS = flags.DEFINE_integer('prompt_tokens', 512, 'Prefill length.')
_DECODE_TOKENS = flags.DEFINE_integer('decode_tokens', 32, 'Greedy decode steps.')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 128, 'Prefill chunk.')
_DTYPES = flags.DEFINE_multi_enum('dtype', ['float32', 'bfloat16'], ['float32', 'bfloat16'], 'Dtypes.')
_IMPLS = flags.DEFINE_multi_enum('impl', ['xla'], ['xla', 'pallas'], 'Kernel sets (repeat).')
_LLAMACPP_PYTHON = flags.DEFINE_string('llamacpp_python', None, 'Interpreter with llama-cpp-python.')
_OUT = flags.DEFINE_string('out', 'experiments/results/bench_model_cpu.json', 'Result JSON.')


def measure(model, prompt: list[int], *, chunk_size: int, decode_tokens: int) -> dict:
  capacity = -(-(len(prompt) + decode_tokens) // chunk_size) * chunk_size

  def prefill():
    last, cache = model.prefill(prompt, cache=model.init_cache(capacity=capacity),
                                chunk_size=chunk_size, logits='last')
    return jax.block_until_ready((last, cache))

  def decode(last, cache):
    out = sampler.decode(model.params, last, jnp.full((1,), len(prompt), jnp.int32), cache,
                         jax.random.key(0), config=model.config, max_new_tokens=decode_tokens,
                         tables=model.tables)
    return jax.block_until_ready(out)

  decode(*prefill())  # compile both
  t0 = time.perf_counter()
  last, cache = prefill()
  prefill_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  decode(last, cache)
  decode_s = time.perf_counter() - t0
  return {'prefill_tokens_per_s': len(prompt) / prefill_s,
          'decode_tokens_per_s': decode_tokens / decode_s}


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
  rows = {}
  invariance_cost = {}
  prompt = None
  for dtype in _DTYPES.value:
    base = gemma_model.load('gemma3-270m', dtype=jnp.dtype(dtype))
    if prompt is None:
      prompt = long_prompt(base.tokenizer, _PROMPT_TOKENS.value)
    for impl in _IMPLS.value:
      rows[f'graftjax_{dtype}_{impl}'] = measure(
          base.with_impl(impl), prompt, chunk_size=_CHUNK_SIZE.value,
          decode_tokens=_DECODE_TOKENS.value)
      print(dtype, impl, rows[f'graftjax_{dtype}_{impl}'])
    if {'xla', 'pallas'} <= set(_IMPLS.value):
      xla, pallas = rows[f'graftjax_{dtype}_xla'], rows[f'graftjax_{dtype}_pallas']
      invariance_cost[dtype] = {k: xla[k] / pallas[k] - 1 for k in xla}
  if _LLAMACPP_PYTHON.value:
    with tempfile.TemporaryDirectory() as tmp:
      path = pathlib.Path(tmp) / 'tokens.json'
      path.write_text(json.dumps(prompt))
      script = pathlib.Path(__file__).parent / 'peers' / 'llamacpp_speed.py'
      proc = subprocess.run([_LLAMACPP_PYTHON.value, str(script), str(gguf_lib.locate_gguf()),
                             str(path), str(os.cpu_count()), str(_DECODE_TOKENS.value)],
                            capture_output=True, text=True, check=True)
    rows['llamacpp'] = json.loads(proc.stdout.strip().splitlines()[-1])
    print('llama.cpp', rows['llamacpp'])
  result = {
      'experiment': 'bench_model', 'command': shlex.join(['python'] + sys.argv),
      'determinism': determinism.record(), 'cpu_count': os.cpu_count(),
      'prompt_tokens': len(prompt), 'decode_tokens': _DECODE_TOKENS.value,
      'chunk_size': _CHUNK_SIZE.value,
      'inputs': {'sha256_prompt_ids': ledger.sha256_tokens(prompt),
                 'gguf_sha256': gguf_lib.expected_sha256()},
      'impls': _IMPLS.value, 'rows': rows, 'invariance_cost': invariance_cost,
  }
  print(f'wrote {_OUT.value} (sha256 {ledger.write_result(_OUT.value, result)})')


if __name__ == '__main__':
  app.run(main)
