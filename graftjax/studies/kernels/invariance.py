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

Results are kept per sample (`run_invariance(...)['samples']`), so runs over
disjoint sample ranges (`shard_range`) can be merged (`merge_shards`) into
one table. `experiment(...)` is experiments/invariance.py (one shard);
`format_table` prints its cells.
"""

from __future__ import annotations

from concurrent import futures
import dataclasses
import os
import pathlib
import tempfile
import time
from typing import Any

import jax.numpy as jnp
import numpy as np
import tqdm

from graftjax import blocks
from graftjax import determinism
from graftjax import exactness
from graftjax import ledger
from graftjax import store as store_lib
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import ops
from graftjax.studies.common import corpus
from graftjax.studies.common import results


def single_pass(model, sample: corpus.TextSample, capacity: int) -> np.ndarray:
  """Continuation logits [Tc, V] from one forward call over the whole text."""
  ids = list(sample.prefix_ids) + list(sample.continuation_ids)
  logits, _ = model.prefill(
    ids, cache=model.init_cache(capacity=capacity), chunk_size=len(ids), logits='all'
  )
  return np.asarray(logits[0, len(sample.prefix_ids) :])


def prefix_block(
  model, sample: corpus.TextSample, *, capacity: int, chunk_size: int
) -> blocks.KVBlock:
  """The prefix's state after a prefill in chunks of `chunk_size` (batch 1)."""
  _, cache = model.prefill(
    sample.prefix_ids,
    cache=model.init_cache(capacity=capacity),
    chunk_size=chunk_size,
    logits='none',
  )
  return blocks.capture(
    cache,
    blocks.Span(0, len(sample.prefix_ids)),
    token_ids=sample.prefix_ids,
    target=model.graft_target,
    chunk_size=chunk_size,
  )


def grafted_continuation(
  model,
  sample: corpus.TextSample,
  block: blocks.KVBlock,
  *,
  capacity: int,
  chunk_size: int,
  batch_size: int,
) -> np.ndarray:
  """Continuation logits [b, Tc, V] after grafting `block` into a batch-b cache."""
  cache = blocks.graft(
    model.init_cache(batch_size=batch_size, capacity=capacity),
    block,
    target=model.graft_target,
    chunk_size=chunk_size,
    allow_other_shape=True,  # the batch size is what this study varies
  )
  logits, _ = model.prefill(
    sample.continuation_ids,
    cache=cache,
    chunk_size=chunk_size,
    start_position=len(sample.prefix_ids),
    logits='all',
  )
  return np.asarray(logits)


def cell_summary(comparisons: list[exactness.Comparison]) -> dict[str, Any]:
  """One sample's rows in one cell: counts, worst KL, and the distinct row digests."""
  summary = exactness.summarize(comparisons)
  return {
    'rows': summary.pop('samples'),
    'rows_byte_equal': summary.pop('byte_equal'),
    **summary,
    'sha256_rows': sorted({c.sha256_candidate for c in comparisons}),
  }


def merge_cells(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Per (chunk size, batch size) totals over per-sample records.

  Args:
    samples: `run_invariance(...)['samples']` entries, possibly from several
      runs over disjoint sample ranges.
  Returns:
    One dict per cell: samples, samples_byte_equal (every row equal),
    rows_byte_equal / rows, worst KL, mean KL and argmax agreement, worst |Δ|.
  """
  if not samples:
    raise ValueError('no samples to merge')
  table = []
  for index, first in enumerate(samples[0]['cells']):
    per_sample = [s['cells'][index] for s in samples]
    if any(
      (c['chunk_size'], c['batch_size']) != (first['chunk_size'], first['batch_size'])
      for c in per_sample
    ):
      raise ValueError('samples were run over different chunk or batch sizes')
    table.append(
      {
        'chunk_size': first['chunk_size'],
        'batch_size': first['batch_size'],
        'samples': len(per_sample),
        'samples_byte_equal': sum(c['rows_byte_equal'] == c['rows'] for c in per_sample),
        'rows': sum(c['rows'] for c in per_sample),
        'rows_byte_equal': sum(c['rows_byte_equal'] for c in per_sample),
        'rows_kl_max': max(c['kl_max'] for c in per_sample),
        'rows_kl_mean': float(np.mean([c['kl_mean'] for c in per_sample])),
        'rows_argmax_agreement': float(np.mean([c['argmax_agreement'] for c in per_sample])),
        'rows_max_abs_diff': max(c['max_abs_diff'] for c in per_sample),
      }
    )
  return table


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
  """Per sample and (chunk size, batch size): the grafted rows vs the single pass.

  The prefix is prefilled and deposited once per chunk size, and its block
  grafted into a cache of each batch size. Blocks prefilled with different
  chunk sizes go to different stores under `store_root`: under impl='xla'
  their bits differ, and one content key must never name two payloads.

  Returns:
    {'samples': per-sample records (digest of the single pass, one
    `cell_summary` per cell, seconds), 'cells': `merge_cells` of them}.
  """
  stores = {c: store_lib.BlockStore(pathlib.Path(store_root) / f'chunk_{c}') for c in chunk_sizes}
  # Batch rows are compared on threads (numpy's float64 passes release the GIL).
  workers = max(1, min(max(batch_sizes), os.cpu_count() or 1))
  records = []
  with futures.ThreadPoolExecutor(workers) as pool:
    for sample in progress(samples) if progress else samples:
      start = time.perf_counter()
      reference = single_pass(model, sample, capacity)
      prepared = exactness.ReferenceLogits(reference)
      cells = []
      for c in chunk_sizes:
        key = stores[c].put(prefix_block(model, sample, capacity=capacity, chunk_size=c))
        block = stores[c].get(key)
        for b in batch_sizes:
          logits = grafted_continuation(
            model, sample, block, capacity=capacity, chunk_size=c, batch_size=b
          )
          cells.append(
            {
              'chunk_size': c,
              'batch_size': b,
              **cell_summary(list(pool.map(prepared.compare, logits))),
            }
          )
      records.append(
        {
          'source': sample.source,
          'sha256_single_pass': prepared.sha256,
          'cells': cells,
          'seconds': time.perf_counter() - start,
        }
      )
  return {'samples': records, 'cells': merge_cells(records)}


# Fields that must agree between shards of one run.
_SHARED_FIELDS = ('experiment', 'model', 'impl', 'dtype', 'capacity', 'settings', 'inputs')
# The same, but absent from shards written before ops had their own impls.
_OPTIONAL_SHARED_FIELDS = ('impls',)


def shard_range(total: int, shard: int, num_shards: int) -> range:
  """The shard-th of num_shards contiguous, near-equal ranges of range(total)."""
  if not 0 <= shard < num_shards:
    raise ValueError(f'shard {shard} outside [0, {num_shards})')
  bounds = np.linspace(0, total, num_shards + 1).round().astype(int)
  return range(int(bounds[shard]), int(bounds[shard + 1]))


def merge_shards(shards: list[dict[str, Any]], command: str) -> dict[str, Any]:
  """One result from shard results of one run (experiments/invariance.py --shard).

  Args:
    shards: verified shard results, in any order.
    command: the merging command, recorded.
  Returns:
    The combined result; `complete` says whether every planned sample is in
    (shards covering only the first samples merge as a run cut short).
  Raises:
    ValueError: for shards of different runs (settings, model, pinned
      configuration), or shards that leave a gap or overlap.
  """
  if not shards:
    raise ValueError('no shards to merge')
  shards = sorted(shards, key=lambda s: s['shard']['samples'][0])
  first = shards[0]
  for shard in shards[1:]:
    for field in _SHARED_FIELDS + _OPTIONAL_SHARED_FIELDS:
      if shard.get(field) != first.get(field):
        raise ValueError(f'shards differ in {field}: {shard.get(field)!r} != {first.get(field)!r}')
    for field in determinism.COMPARABLE_FIELDS:
      if shard['determinism'][field] != first['determinism'][field]:
        raise ValueError(f'shards differ in determinism {field}')
  covered = [i for s in shards for i in range(*s['shard']['samples'])]
  if covered != list(range(len(covered))):
    raise ValueError(f'shards cover samples {covered}: not 0, 1, ... without gaps or overlaps')
  samples = [record for s in shards for record in s['samples']]
  return {
    **{field: first[field] for field in _SHARED_FIELDS},
    **{field: first[field] for field in _OPTIONAL_SHARED_FIELDS if field in first},
    'command': command,
    # A run stopped early is merged as what it is: its first samples_run samples.
    'samples_run': len(covered),
    'complete': len(covered) == first['settings']['samples'],
    'shards': [
      {
        'command': s['command'],
        'result_sha256': s['result_sha256'],
        'samples': s['shard']['samples'],
      }
      for s in shards
    ],
    'determinism': first['determinism'],
    'samples': samples,
    'cells': merge_cells(samples),
  }


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `experiment` runs (experiments/invariance.py builds it from its flags): its
  arguments, as its docstring describes them."""

  model_name: str
  impl: str
  per_op: dict[str, str]
  dtype: str
  samples: int
  prefix_tokens: int
  continuation_tokens: int
  chunk_sizes: tuple[int, ...]
  batch_sizes: tuple[int, ...]
  shard: int = 0
  num_shards: int = 1
  dot_precision: str = 'highest'


def experiment(
  settings: Settings,
  *,
  command: str,
) -> dict:
  """experiments/invariance.py: loads the model with the given kernels (float32 products at
  `dot_precision`), runs shard `shard` of `num_shards` of the samples; the result."""
  if not 0 <= settings.shard < settings.num_shards:
    raise ValueError(f'shard {settings.shard} must be in [0, num_shards={settings.num_shards})')
  model = gemma_model.load_named(settings.model_name, dtype=jnp.dtype(settings.dtype)).with_impl(
    settings.impl, **settings.per_op
  )
  model = model.with_dot_precision(settings.dot_precision)
  tokenizer = model.tokenizer
  texts = corpus.text_samples(
    tokenizer,
    count=settings.samples,
    prefix_tokens=settings.prefix_tokens,
    continuation_tokens=settings.continuation_tokens,
  )
  indices = shard_range(len(texts), settings.shard, settings.num_shards)
  need = settings.prefix_tokens + settings.continuation_tokens
  capacity = -(-need // ops.CAPACITY_MULTIPLE) * ops.CAPACITY_MULTIPLE
  with tempfile.TemporaryDirectory() as tmp:
    result = run_invariance(
      model=model,
      samples=[texts[i] for i in indices],
      chunk_sizes=tuple(settings.chunk_sizes),
      batch_sizes=tuple(settings.batch_sizes),
      capacity=capacity,
      store_root=tmp,
      progress=lambda it: tqdm.tqdm(it, desc='samples'),
    )
  for index, record in zip(indices, result['samples']):
    sample = texts[index]
    record.update(
      index=index,
      sha256_prefix_ids=ledger.sha256_tokens(sample.prefix_ids),
      sha256_continuation_ids=ledger.sha256_tokens(sample.continuation_ids),
    )
  return {
    **results.header(
      'invariance', inputs=results.model_inputs(model, settings.model_name), command=command
    ),
    'model': settings.model_name,
    'impl': settings.impl,
    'impls': {op: settings.per_op.get(op, settings.impl) for op in config_lib.OPS},
    'dtype': settings.dtype,
    'dot_precision': settings.dot_precision,
    'capacity': capacity,
    'settings': {
      'samples': settings.samples,
      'prefix_tokens': settings.prefix_tokens,
      'continuation_tokens': settings.continuation_tokens,
      'chunk_sizes': list(settings.chunk_sizes),
      'batch_sizes': list(settings.batch_sizes),
    },
    'shard': {
      'index': settings.shard,
      'count': settings.num_shards,
      'samples': [indices.start, indices.stop],
    },
    **result,
  }


def format_table(result: dict[str, Any]) -> str:
  """Per chunk size and batch size: byte-equal samples, KL max, argmax agreement, max |Δ|."""
  lines = [
    f'{result["model"]} impl={result["impl"]} {result["dtype"]}'
    f' dots={result.get("dot_precision", "highest")} on {result["determinism"]["device_kind"]}',
    'chunk  batch  samples byte-equal  KL max  argmax  max|Δ|',
  ]
  for cell in result['cells']:
    lines.append(
      f'{cell["chunk_size"]:>5}  {cell["batch_size"]:>5}  {cell["samples_byte_equal"]:>3}/{cell["samples"]:<3}'
      f'              {cell["rows_kl_max"]:.3g}  {100 * cell["rows_argmax_agreement"]:.1f}%'
      f'  {cell["rows_max_abs_diff"]:.3g}'
    )
  if not result.get('complete', True):
    lines.append(
      f'incomplete: {result["samples_run"]} of {result["settings"]["samples"]} planned samples'
    )
  seconds = [s['seconds'] for s in result['samples']]
  lines.append(f'{np.mean(seconds):.1f} s per sample')
  return '\n'.join(lines)
