"""Batched generation for the solve step: many prompts, few compiled programs.

Every batch has the same number of rows and the whole run one cache
capacity. A prompt is right-aligned in a region padded to a multiple of
`bucket` slots; the padding slots hold position -1, which no query ever
attends to. So prompts of any length run the same two programs: one prefill
chunk of [rows, bucket] tokens and one decode loop. A shared prefix (the
few-shot examples) is computed once and copied into every batch.

Rows are split over a `jax.sharding` mesh of the local devices (`data`
axis): more accelerators, more rows at once, no code change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from graftjax.models import cache as cache_lib
from graftjax.models.gemma import sampler

EMPTY = cache_lib.EMPTY_POSITION


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The fixed shapes of a run.

  Attributes:
    rows: rows per batch (a multiple of the mesh's device count).
    bucket: prompt regions are padded to a multiple of this many slots.
    capacity: cache slots: prefix + longest padded prompt + new tokens.
  """

  rows: int
  bucket: int
  capacity: int


def plan(
  prompt_lengths: Sequence[int], *, prefix_length: int, max_new_tokens: int, rows: int, bucket: int
) -> Shapes:
  """Shapes that fit every prompt of the run."""
  if rows <= 0 or bucket <= 0 or max_new_tokens <= 0:
    raise ValueError(f'rows={rows}, bucket={bucket}, max_new_tokens={max_new_tokens} must be > 0')
  if not prompt_lengths or min(prompt_lengths) <= 0:
    raise ValueError('every prompt needs at least one token')
  region = _round_up(max(prompt_lengths), bucket)
  return Shapes(rows, bucket, _round_up(prefix_length + region + max_new_tokens, bucket))


def data_mesh(devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """A one-axis ('data') mesh over the given devices (default: all local ones)."""
  devices = list(devices if devices is not None else jax.local_devices())
  return jax.sharding.Mesh(np.asarray(devices), ('data',))


def generate(
  model,
  prompts: Sequence[Sequence[int]],
  *,
  max_new_tokens: int,
  stop_ids: tuple[int, ...],
  sampling: sampler.SamplingConfig = sampler.SamplingConfig(),
  seed: int = 0,
  prefix_ids: Sequence[int] = (),
  rows: int = 8,
  bucket: int = 64,
  mesh: jax.sharding.Mesh | None = None,
  progress: Callable[[int], None] | None = None,
) -> list[tuple[int, ...]]:
  """Generates a continuation of `prefix_ids + prompt` for every prompt.

  Prompts run in the given order, `rows` at a time (the last batch is filled
  with empty rows). A row's bits can depend on its batch neighbours (XLA is
  not row-invariant), so the same prompts in the same order give the same
  tokens.

  Args:
    model: a `Gemma`.
    prompts: token ids of each prompt (without the prefix).
    max_new_tokens: decode budget per prompt.
    stop_ids: a row stops after producing one of these.
    sampling: greedy (default) or temperature sampling.
    seed: PRNG seed; batch i samples from `fold_in(key(seed), i)`.
    prefix_ids: tokens before every prompt (e.g. few-shot examples, BOS first).
    rows: rows per batch; a multiple of the mesh's device count.
    bucket: prompt padding granularity and prefill chunk size.
    mesh: devices to split rows over (default: every local device).
    progress: called with the number of prompts finished after each batch.
  Returns:
    Per prompt, the generated ids up to and including the first stop id.
  """
  mesh = mesh or data_mesh()
  if rows % mesh.size:
    raise ValueError(f'rows={rows} is not a multiple of the {mesh.size} devices of the mesh')
  shapes = plan(
    [len(p) for p in prompts],
    prefix_length=len(prefix_ids),
    max_new_tokens=max_new_tokens,
    rows=rows,
    bucket=bucket,
  )
  base = _prefix_cache(model, prefix_ids, shapes, mesh)
  out: list[tuple[int, ...]] = []
  for index, begin in enumerate(range(0, len(prompts), rows)):
    batch = [tuple(int(t) for t in p) for p in prompts[begin : begin + rows]]
    tokens = _generate_batch(
      model,
      batch,
      jax.tree.map(jnp.copy, base),
      shapes=shapes,
      prefix_length=len(prefix_ids),
      max_new_tokens=max_new_tokens,
      stop_ids=stop_ids,
      sampling=sampling,
      rng=jax.random.fold_in(jax.random.key(seed), index),
      mesh=mesh,
    )
    out.extend(tokens[: len(batch)])
    if progress is not None:
      progress(len(batch))
  return out


def cut_at_stop(tokens: Sequence[int], stop_ids: tuple[int, ...]) -> tuple[int, ...]:
  """Tokens up to and including the first stop id (all of them if none)."""
  for i, t in enumerate(tokens):
    if t in stop_ids:
      return tuple(int(x) for x in tokens[: i + 1])
  return tuple(int(x) for x in tokens)


def _round_up(n: int, multiple: int) -> int:
  return math.ceil(n / multiple) * multiple


def _put(tree, mesh, spec_of):
  return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), tree, spec_of(tree))


def _cache_specs(cache: cache_lib.KVCache):
  return cache.replace(
    k=P(None, 'data'), v=P(None, 'data'), positions=P('data'), segments=P('data'), length=P()
  )


def _prefix_cache(model, prefix_ids, shapes: Shapes, mesh) -> cache_lib.KVCache:
  """An empty cache of the run's shape, holding the prefix in every row."""
  cache = _put(
    model.init_cache(batch_size=shapes.rows, capacity=shapes.capacity), mesh, _cache_specs
  )
  if len(prefix_ids):
    _, cache = model.prefill(prefix_ids, cache=cache, chunk_size=shapes.bucket, logits='none')
  return cache


def _generate_batch(
  model,
  batch,
  cache,
  *,
  shapes: Shapes,
  prefix_length: int,
  max_new_tokens: int,
  stop_ids,
  sampling,
  rng,
  mesh,
) -> list[tuple[int, ...]]:
  region = _round_up(max(len(p) for p in batch), shapes.bucket)
  tokens = np.full((shapes.rows, region), model.config.pad_id, np.int32)
  positions = np.full((shapes.rows, region), EMPTY, np.int32)
  for row, prompt in enumerate(batch):  # right-aligned: the last slot is the last token
    tokens[row, region - len(prompt) :] = prompt
    positions[row, region - len(prompt) :] = prefix_length + np.arange(len(prompt))
  data = NamedSharding(mesh, P('data'))
  last = None
  for begin in range(0, region, shapes.bucket):
    chunk = slice(begin, begin + shapes.bucket)
    final = begin + shapes.bucket == region
    last, cache = model.forward(
      jax.device_put(tokens[:, chunk], data),
      jax.device_put(positions[:, chunk], data),
      cache,
      logits='last' if final else 'none',
    )
  next_position = np.full((shapes.rows,), prefix_length, np.int32)
  next_position[: len(batch)] += [len(p) for p in batch]
  generated, _, _, _ = sampler.decode(
    model.params,
    last,
    jax.device_put(next_position, data),
    cache,
    rng,
    config=model.config,
    max_new_tokens=max_new_tokens,
    sampling=sampling,
    stop_ids=tuple(stop_ids),
    tables=model.tables,
  )
  return [cut_at_stop(row, tuple(stop_ids)) for row in np.asarray(generated).tolist()]
