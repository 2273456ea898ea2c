"""Does a block computed alone keep its bits when it moves to another slot? Per attention impl.

The library of experiments/slot_moves.py. A block of `tokens` random token ids is prefilled
alone at slot 0 of a cache of `capacity` slots (rope_relative, chunks of `chunk_size`), and
again fresh at slot s in segment 1 after `reserve(s)` empty slots; a row per (impl, s) says in
how many layers k or v differ and by how much. Composition moves blocks only by whole attention
splits, exact where attention is split-invariant ('xla_split', 'pallas'): docs/composition.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graftjax import ledger
from graftjax.models import cache as cache_lib
from graftjax.studies.paging import paging_scale
from graftjax.studies.common import results


def _model(base, impl: str):
  model = base.with_position_scheme('rope_relative')
  return model.with_impl('xla', attention=impl) if impl != 'xla' else model


def _rows(cache, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
  return np.asarray(cache.k)[:, 0, start : start + n], np.asarray(cache.v)[:, 0, start : start + n]


def experiment(
  *,
  model_name: str,
  impls: Sequence[str],
  tokens: int,
  chunk_size: int,
  capacity: int,
  slots: Sequence[int],
  seed: int = 0,
  command: str | None = None,
) -> dict[str, Any]:
  """One row per (impl, slot): the block at that slot against the block at slot 0."""
  base = paging_scale.load_model(model_name, dtype='float32', impl='xla')
  rng = np.random.default_rng(seed)
  ids = [2, *(int(t) for t in rng.integers(3, min(base.config.vocab_size, 20_000), tokens - 1))]
  rows = []
  for impl in impls:
    model = _model(base, impl)
    prefill = lambda cache, m=model: m.prefill(
      ids, cache=cache, chunk_size=chunk_size, logits='none', segment=1
    )[1]
    k0, v0 = _rows(prefill(model.init_cache(capacity=capacity)), 0, tokens)
    for slot in slots:
      k, v = _rows(
        prefill(cache_lib.reserve(model.init_cache(capacity=capacity), slot)), slot, tokens
      )
      differ = [
        layer
        for layer in range(k.shape[0])
        if not (np.array_equal(k[layer], k0[layer]) and np.array_equal(v[layer], v0[layer]))
      ]
      rows.append(
        {
          'attention': impl,
          'slot': slot,
          'layers_differ': len(differ),
          'layers': int(k.shape[0]),
          'max_abs_dk': float(np.abs(k - k0).max()),
          'max_abs_dv': float(np.abs(v - v0).max()),
        }
      )
  return {
    **results.header(
      'slot_moves',
      inputs={
        **results.model_inputs(base, model_name),
        'sha256_token_ids': ledger.sha256_bytes(np.asarray(ids, np.int32).tobytes()),
      },
      command=command,
    ),
    'model': model_name,
    'position_scheme': 'rope_relative',
    'tokens': tokens,
    'chunk_size': chunk_size,
    'capacity': capacity,
    'rows': rows,
    'summary': {
      f'{impl}_byte_equal_at': [
        r['slot'] for r in rows if r['attention'] == impl and not r['layers_differ']
      ]
      for impl in impls
    },
  }
