"""Which attention paths are practical on CPU: one prefill timed under each.

The library of experiments/bench_cpu_paths.py. A path is (attention impl, position scheme):
'xla' under 'rope' (the needle study's top-1 arm), 'xla' under 'rope_relative', 'xla_split'
under 'rope_relative' (the top-k arm on CPU: split-invariant, so pages compose exactly) and
'pallas' under 'rope_relative' (every op on the Pallas kernels, in the interpreter on CPU).
Each prefills `tokens` tokens of standard-library text into an empty cache of `capacity` slots
in one chunk, once to compile and once timed; the Pallas interpreter only up to `pallas_tokens`
(it is orders of magnitude slower).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from graftjax import ledger
from graftjax.studies.common import corpus
from graftjax.studies.paging import needle
from graftjax.studies.paging import paging_scale
from graftjax.studies.common import results

PATHS = (
  ('xla', 'rope'),
  ('xla', 'rope_relative'),
  ('xla_split', 'rope_relative'),
  ('pallas', 'rope_relative'),
)


def _model(base, impl: str, scheme: str):
  model = base.with_position_scheme(scheme)
  if impl == 'xla_split':
    return model.with_impl('xla', attention='xla_split')
  return model.with_impl(impl)


def _prefill_s(model, ids, capacity: int) -> tuple[float, float]:
  """(first call s, compile included; second call s) of one prefill of `ids` in one chunk."""
  times = []
  for _ in range(2):
    start = time.perf_counter()
    logits, _ = model.prefill(
      ids, cache=model.init_cache(capacity=capacity), chunk_size=len(ids), logits='last'
    )
    jax.block_until_ready(logits)
    times.append(time.perf_counter() - start)
  return times[0], times[1]


def experiment(
  *,
  model_name: str,
  tokens: Sequence[int],
  capacity: int,
  pallas_tokens: int,
  command: str | None = None,
) -> dict[str, Any]:
  """Prefill seconds of every path in `PATHS` at every length in `tokens`; the result."""
  base = paging_scale.load_model(model_name, dtype='float32', impl='xla')
  text = needle.haystack_ids(base.tokenizer, corpus.stdlib_files(), max(tokens))
  rows = []
  for n in tokens:
    ids = np.asarray(text[:n], np.int32)
    for impl, scheme in PATHS:
      if impl == 'pallas' and n > pallas_tokens:
        continue
      first, second = _prefill_s(_model(base, impl, scheme), ids, capacity)
      rows.append(
        {
          'attention': impl,
          'position_scheme': scheme,
          'tokens': n,
          'first_s': first,
          'prefill_s': second,
          'tokens_per_s': n / second,
        }
      )
  by = {(r['attention'], r['position_scheme'], r['tokens']): r['prefill_s'] for r in rows}
  return {
    **results.header(
      'bench_cpu_paths',
      inputs={
        **results.model_inputs(base, model_name),
        'sha256_token_ids': ledger.sha256_bytes(np.asarray(text, np.int32).tobytes()),
      },
      command=command,
    ),
    'model': model_name,
    'capacity': capacity,
    'load_average': list(os.getloadavg()),
    'timing': 'one timed prefill after a compiling one, on a shared CPU',
    'rows': rows,
    'summary': {
      f'{impl}_{scheme}_over_xla_rope_{n}': by[(impl, scheme, n)] / by[('xla', 'rope', n)]
      for impl, scheme, n in by
      if (impl, scheme) != ('xla', 'rope')
    },
  }
