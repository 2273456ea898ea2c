"""Do the Pallas kernels give the same bits in another process and another device call?

The library of experiments/kernel_determinism.py. `experiment(...)` digests every kernel
case (seeded inputs, float32 and bfloat16) and a model's logits under impl=pallas;
`merge(...)` checks that runs share one configuration and lists every output whose digest
differs between them.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from graftjax import determinism
from graftjax import ledger
from graftjax.kernels import attention as attention_lib
from graftjax.kernels import matmul as matmul_lib
from graftjax.kernels import rmsnorm as rmsnorm_lib
from graftjax.kernels import rotary as rotary_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import positions as positions_lib
from graftjax.models.gemma import schemes
from graftjax.studies.common import corpus
from graftjax.studies.common import results


def kernel_cases(quick: bool) -> dict[str, Callable[[], jax.Array]]:
  """Name -> a call of one kernel on seeded inputs, for float32 and bfloat16."""
  cases = {}
  for dtype in (jnp.float32, jnp.bfloat16):
    cases |= {
      f'{name}_{jnp.dtype(dtype).name}': fn for name, fn in _cases_of_dtype(dtype, quick).items()
    }
  return cases


def _cases_of_dtype(dtype, quick: bool) -> dict[str, Callable[[], jax.Array]]:
  interpret = jax.default_backend() != 'gpu'
  t, s, heads, head_dim, d, f = (12, 64, 4, 16, 32, 64) if quick else (64, 512, 4, 256, 640, 2048)
  rng = np.random.default_rng(0)
  draw = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
  q, k, v = draw(1, t, heads, head_dim), draw(1, s, 1, head_dim), draw(1, s, 1, head_dim)
  x, w_norm, w_dense = draw(t, d), draw(d), draw(d, f)
  q_pos = jnp.arange(s - t, s, dtype=jnp.int32)[None]
  k_pos = jnp.arange(s, dtype=jnp.int32)[None]
  segments = (k_pos >= s // 2).astype(jnp.int32)
  table = positions_lib.table(head_dim, 10_000.0, s)
  attend = lambda **kw: attention_lib.attention(q, k, v, q_pos, k_pos, interpret=interpret, **kw)
  return {
    'attention': attend,
    'attention_window': lambda: attend(window=s // 4),
    'attention_segments': lambda: attend(q_segments=segments[:, s - t :], k_segments=segments),
    'attention_alibi': lambda: attend(
      distance_bias=positions_lib.bias_table(schemes.ALIBI, heads, s)
    ),
    'attention_rope_relative': lambda: attend(relative_table=(table['cos'], table['sin'])),
    'rotary': lambda: rotary_lib.apply_rotary(q, q_pos, theta=10_000.0, interpret=interpret),
    'rms_norm': lambda: rmsnorm_lib.rms_norm(x, w_norm, interpret=interpret),
    'matmul': lambda: matmul_lib.matmul(x, w_dense, interpret=interpret),
  }


def experiment(
  *,
  model_name: str,
  samples: int,
  prefix_tokens: int,
  label: str,
  quick: bool,
  command: str | None = None,
) -> dict[str, Any]:
  """Digests of every kernel case and of `model_name`'s logits under impl=pallas."""
  digests, errors = {}, {}
  for name, fn in kernel_cases(quick).items():
    try:
      digests[name] = ledger.sha256_array(np.asarray(fn()))
    except Exception as e:
      errors[name] = f'{type(e).__name__}: {str(e)[:500]}'  # reported, never digested
  model = gemma_model.load_named(model_name, impl='pallas')
  tokenizer = model.tokenizer
  texts = corpus.text_samples(
    tokenizer, count=samples, prefix_tokens=prefix_tokens, continuation_tokens=1
  )
  capacity = -(-prefix_tokens // 64) * 64
  for i, sample in enumerate(texts):
    logits, _ = model.prefill(
      sample.prefix_ids,
      cache=model.init_cache(capacity=capacity),
      chunk_size=capacity,
      logits='all',
    )
    digests[f'model_logits_sample_{i}'] = ledger.sha256_array(np.asarray(logits))
  inputs = {
    **results.model_inputs(model, model_name),
    'samples': [ledger.sha256_tokens(s.prefix_ids) for s in texts],
  }
  return {
    **results.header('kernel_determinism', inputs=inputs, command=command),
    'label': label,
    'process': {'pid': os.getpid(), 'host': socket.gethostname()},
    'model': model_name,
    'quick': quick,
    'digests': digests,
    'errors': errors,
  }


def merge(paths: list[str], command: str) -> dict[str, Any]:
  """Compares runs; refuses runs of another configuration or other inputs."""
  runs = [ledger.verify_result(p) for p in paths]
  first = runs[0]
  for other, path in zip(runs[1:], paths[1:]):
    for field in determinism.COMPARABLE_FIELDS:
      if other['determinism'][field] != first['determinism'][field]:
        raise ValueError(f'{path}: determinism {field} differs from {paths[0]}')
    if (other['inputs'], other['quick'], sorted(other['digests'])) != (
      first['inputs'],
      first['quick'],
      sorted(first['digests']),
    ):
      raise ValueError(f'{path}: other inputs or outputs than {paths[0]}')
  differing = sorted(
    name for name in first['digests'] if len({r['digests'][name] for r in runs}) > 1
  )
  return {
    'experiment': 'kernel_determinism',
    'command': command,
    'runs': [
      {
        'label': r['label'],
        'process': r['process'],
        'command': r['command'],
        'result_sha256': r['result_sha256'],
      }
      for r in runs
    ],
    'determinism': first['determinism'],
    'inputs': first['inputs'],
    'outputs': len(first['digests']),
    'identical': not differing,
    'differing': differing,
    'errors': {r['label']: r['errors'] for r in runs if r['errors']},
    'digests': {name: sorted({r['digests'][name] for r in runs}) for name in first['digests']},
  }
