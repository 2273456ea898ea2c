"""Grafted continuation vs a single-pass prefill of the whole text.

With chunk-invariant kernels (`impl='pallas'`) a token's logits do not
depend on how the text was chunked, on the batch size, or on whether the
keys before it were computed in the same call or grafted from a block. The
arms, for one sample and a chunk size c:
  single pass   prefix + continuation in one forward call, batch 1;
  grafted       prefix prefilled in chunks of c (batch 1), captured, put in
                the store, read back, grafted into a cache of batch b; the
                continuation then processed in chunks of c.
Every arm has the same cache capacity. Batch rows repeat the sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graftjax import blocks
from graftjax import corpus
from graftjax import exactness


def single_pass(model, sample: corpus.TextSample, capacity: int) -> np.ndarray:
  """Continuation logits [Tc, V] from one forward call over the whole text."""
  ids = list(sample.prefix_ids) + list(sample.continuation_ids)
  logits, _ = model.prefill(ids, cache=model.init_cache(capacity=capacity),
                            chunk_size=len(ids), logits='all')
  return np.asarray(logits[0, len(sample.prefix_ids):])


def grafted(model, sample: corpus.TextSample, *, capacity: int, chunk_size: int,
            batch_size: int, store) -> np.ndarray:
  """Continuation logits [b, Tc, V] after grafting a chunk-prefilled prefix."""
  _, cache = model.prefill(sample.prefix_ids, cache=model.init_cache(capacity=capacity),
                           chunk_size=chunk_size, logits='none')
  block = blocks.capture(cache, blocks.Span(0, len(sample.prefix_ids)),
                         token_ids=sample.prefix_ids, model_fingerprint=model.fingerprint,
                         position_scheme=model.position_scheme)
  key = store.put(block)
  cache = blocks.graft(model.init_cache(batch_size=batch_size, capacity=capacity),
                       store.get(key), model_fingerprint=model.fingerprint,
                       position_scheme=model.position_scheme)
  logits, _ = model.prefill(sample.continuation_ids, cache=cache, chunk_size=chunk_size,
                            start_position=len(sample.prefix_ids), logits='all')
  return np.asarray(logits)


def run_invariance(
    *,
    model,
    samples: list[corpus.TextSample],
    chunk_sizes: tuple[int, ...],
    batch_sizes: tuple[int, ...],
    capacity: int,
    store_root,
    progress=None,
) -> dict[str, Any]:
  """Per (chunk size, batch size): byte-equal rows, KL and argmax vs the single pass.

  Blocks prefilled with different chunk sizes go to different stores under
  `store_root`: under impl='xla' their bits differ, and one content key
  must never name two payloads.
  """
  import pathlib  # pylint: disable=g-import-not-at-top

  from graftjax import store as store_lib  # pylint: disable=g-import-not-at-top

  stores = {c: store_lib.BlockStore(pathlib.Path(store_root) / f'chunk_{c}') for c in chunk_sizes}
  cells = {(c, b): [] for c in chunk_sizes for b in batch_sizes}
  iterate = progress(samples) if progress else samples
  for sample in iterate:
    reference = single_pass(model, sample, capacity)
    for (c, b), found in cells.items():
      logits = grafted(model, sample, capacity=capacity, chunk_size=c, batch_size=b,
                       store=stores[c])
      found.append([exactness.compare(reference, row) for row in logits])
  table = []
  for (c, b), per_sample in cells.items():
    rows = [comparison for sample_rows in per_sample for comparison in sample_rows]
    table.append({
        'chunk_size': c, 'batch_size': b, 'samples': len(per_sample),
        'samples_byte_equal': sum(all(r.byte_equal for r in s) for s in per_sample),
        **{f'rows_{k}': v for k, v in exactness.summarize(rows).items()},
        'sha256_first_sample_rows': [r.sha256_candidate for r in per_sample[0]],
    })
  return {'cells': table}
