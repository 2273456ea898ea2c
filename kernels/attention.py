"""Causal attention of a chunk of queries over a fixed-capacity KV cache.

  out[b, t, n] = softmax_j(score(b, t, n, j)) v[b, j, n // G]

over the visible slots j (`visible`), with dot-product or relative-rotary
(`relative_table`) scores, plus an optional bias indexed by head and distance
(`distance_bias`). Two Pallas kernels,
chunk-invariant by construction: `attention_split` (a partial online
softmax per query block and split of the cache) and `attention_combine`
(the splits summed in a fixed order). The pure-jnp reference is
`attention_reference`. docs/kernels.md says why the bits of a query row
depend only on that row and the keys it sees.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from graftjax.kernels import _common
from graftjax.kernels import dots
from graftjax.kernels.attention_combine import combine_kernel
from graftjax.kernels.attention_reference import attention_reference  # noqa: F401
from graftjax.kernels.attention_reference import visible  # noqa: F401
from graftjax.kernels.attention_split import split_kernel
from graftjax.kernels.attention_split import tile_ranges

_HIGHEST = lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes and warps of the attention kernels.

  All are part of the numerics: fresh and grafted paths must use the same
  values (the defaults for their dtype and head grouping) for their bits to
  agree.

  Attributes:
    block_q: query tokens per program; a program holds block_q * G query rows
      (G = query heads per kv head).
    block_k: cache slots per KV tile; the capacity S must be a multiple.
    block_s: cache slots per split (a multiple of block_k): the unit of
      parallelism over S, summed in a fixed order (combine_group).
    block_h: head-dim pairs per step of the relative (`relative_table`)
      score, a [block_q * G, block_k, block_h] gather; H / 2 must be a
      multiple.
    num_warps: Triton warps per program; the layout, hence the order of the
      cross-thread sums, depends on it.
    combine_group: splits per step of the combine, loaded together and
      summed in one reduction before the steps are added in ascending order
      (`combine_kernel`); a power of 2, 1 = the plain ascending sum.
    combine_block_h: head dims per combine program; with it the group's
      reduction (so its bits) may change, but not with combine_group 1.
  """

  block_q: int = 4
  block_k: int = 64
  block_s: int = 512
  block_h: int = 8
  num_warps: int = 4
  combine_group: int = 1
  combine_block_h: int = 64


# Query rows per program (block_q * G). Few rows suit decode (one token) and
# keep float32 operands, whose IEEE dots run on CUDA cores, in registers.
_ROWS = 16
# Per compute dtype, measured with experiments/bench_attention_tiles.py
# (experiments/results/invariance_cost/bench_attention_tiles_h200.json, the combine from
# runs/bench_attention_tiles_h200_grouped.json); block_q follows from G.
_DEFAULTS = {
  'bfloat16': BlockSizes(block_k=64, block_s=512, combine_group=16, combine_block_h=16),
  'float16': BlockSizes(block_k=64, block_s=512, combine_group=16, combine_block_h=16),
  'float32': BlockSizes(block_k=32, block_s=256, combine_group=32, combine_block_h=16),
}


def default_block_sizes(dtype, group: int) -> BlockSizes:
  """The tile sizes every path of this dtype and grouping G uses."""
  name = jnp.dtype(dtype).name
  if name not in _DEFAULTS:
    raise ValueError(f'no default block sizes for {name}; known: {sorted(_DEFAULTS)}')
  if group <= 0:
    raise ValueError(f'query heads per kv head must be positive, got {group}')
  return dataclasses.replace(_DEFAULTS[name], block_q=max(1, _ROWS // group))


def default_block_k_values() -> set[int]:
  """Every dtype's default KV tile (the model's capacity must fit them all)."""
  return {sizes.block_k for sizes in _DEFAULTS.values()}


def _check_arguments(
  q,
  k,
  v,
  q_positions,
  k_positions,
  q_segments,
  k_segments,
  distance_bias,
  relative_table,
  *,
  window,
  block_sizes,
  max_query_tokens,
  interpret,
) -> tuple[BlockSizes, int]:
  """Every shape and knob check of `attention` (ValueError with the numbers).

  Returns:
    (the block sizes to use, head dims per combine program).
  """
  if q.ndim != 4 or k.ndim != 4:
    raise ValueError(f'q must be [B, T, N, H] and k [B, S, K, H], got q {q.shape} and k {k.shape}')
  batch, num_q, num_heads, head_dim = q.shape
  _, capacity, num_kv_heads, _ = k.shape
  if v.shape != k.shape:
    raise ValueError(f'v {v.shape} must have the shape of k {k.shape}')
  if k.shape[0] != batch or k.shape[3] != head_dim:
    raise ValueError(f'k {k.shape} must match q {q.shape} in batch and head dim')
  if num_heads % num_kv_heads:
    raise ValueError(f'query heads N={num_heads} must be a multiple of kv heads K={num_kv_heads}')
  if q_positions.shape != (batch, num_q):
    raise ValueError(f'q_positions {q_positions.shape} must be [B, T] = {(batch, num_q)}')
  if k_positions.shape != (batch, capacity):
    raise ValueError(f'k_positions {k_positions.shape} must be [B, S] = {(batch, capacity)}')
  if not (q.dtype == k.dtype == v.dtype):
    raise ValueError(f'q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}')
  group = num_heads // num_kv_heads
  sizes = block_sizes or default_block_sizes(q.dtype, group)
  if (q_segments is None) != (k_segments is None):
    raise ValueError('q_segments and k_segments must be given together')
  if q_segments is not None and q_segments.shape != (batch, num_q):
    raise ValueError(f'q_segments {q_segments.shape} must be [B, T] = {(batch, num_q)}')
  if k_segments is not None and k_segments.shape != (batch, capacity):
    raise ValueError(f'k_segments {k_segments.shape} must be [B, S] = {(batch, capacity)}')
  if distance_bias is not None and (distance_bias.ndim != 2 or distance_bias.shape[0] != num_heads):
    raise ValueError(f'distance_bias {distance_bias.shape} must be [N, D] with N={num_heads}')
  if relative_table is not None:
    cos, sin = relative_table
    if head_dim % 2:
      raise ValueError(f'relative scores need an even head dim, got H={head_dim}')
    if cos.ndim != 2 or cos.shape[1] != head_dim // 2 or sin.shape != cos.shape:
      raise ValueError(
        f'relative_table cos {cos.shape} and sin {sin.shape} must both be'
        f' [D, H/2] with H/2={head_dim // 2}'
      )
    if sizes.block_h <= 0 or (head_dim // 2) % sizes.block_h:
      raise ValueError(f'H/2={head_dim // 2} must be a multiple of block_h={sizes.block_h}')
  if min(sizes.block_q, sizes.block_k, sizes.block_s) <= 0:
    raise ValueError(f'block sizes must be positive: {sizes}')
  if sizes.block_s % sizes.block_k:
    raise ValueError(f'block_s={sizes.block_s} must be a multiple of block_k={sizes.block_k}')
  if capacity % sizes.block_k:
    raise ValueError(f'cache capacity S={capacity} must be a multiple of block_k={sizes.block_k}')
  if window is not None and window <= 0:
    raise ValueError(f'window must be positive or None, got {window}')
  if not _common.is_power_of_2(sizes.combine_group):
    raise ValueError(f'combine_group={sizes.combine_group} must be a positive power of 2')
  combine_cols = min(sizes.combine_block_h, head_dim)
  if combine_cols <= 0 or head_dim % combine_cols:
    raise ValueError(
      f'combine_block_h={sizes.combine_block_h} must be positive and divide the'
      f' head dim H={head_dim} (or exceed it)'
    )
  if max_query_tokens < sizes.block_q:
    raise ValueError(f'{max_query_tokens=} must be at least block_q={sizes.block_q}')
  rows = sizes.block_q * group
  if not interpret:
    for name, size in (('block_q * G', rows), ('block_k', sizes.block_k), ('head dim H', head_dim)):
      if not _common.is_power_of_2(size) or size < 16:
        raise ValueError(f'{name}={size} must be a power of 2 and >= 16 for the GPU kernel')
    if relative_table is not None and not _common.is_power_of_2(sizes.block_h):
      raise ValueError(f'block_h={sizes.block_h} must be a power of 2 for the GPU kernel')
  return sizes, combine_cols


@functools.partial(
  jax.jit,
  static_argnames=(
    'window',
    'block_sizes',
    'precision',
    'num_stages',
    'combine_stages',
    'skip_masked_tiles',
    'max_query_tokens',
    'interpret',
  ),
)
def attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  q_positions: jax.Array,
  k_positions: jax.Array,
  *,
  q_segments: jax.Array | None = None,
  k_segments: jax.Array | None = None,
  distance_bias: jax.Array | None = None,
  relative_table: tuple[jax.Array, jax.Array] | None = None,
  window: int | None = None,
  block_sizes: BlockSizes | None = None,
  precision: dots.Precision = _HIGHEST,
  num_stages: int | None = None,
  combine_stages: int = 1,
  skip_masked_tiles: bool = True,
  max_query_tokens: int = 2048,
  interpret: bool = False,
) -> jax.Array:
  """Causal, optionally windowed, multi-query attention over the cache.

  Args:
    q: [B, T, N, H] queries, already scaled (and rotated, unless
      `relative_table` is given).
    k: [B, S, K, H] keys of the whole cache capacity S (N = K * G).
    v: [B, S, K, H] values.
    q_positions: [B, T] int32 position of each query.
    k_positions: [B, S] int32 position of each slot, -1 for an empty slot.
    q_segments: [B, T] int32 segment of each query, or None (no segment
      masking): a query in segment s > 0 sees only slots of segment s, one in
      segment 0 sees every slot.
    k_segments: [B, S] int32 segment of each slot; given iff q_segments is.
    distance_bias: [N, D] float32 score bias of each query head and distance,
      or None: adds distance_bias[n, q_pos - k_pos] to the scores (ALiBi's
      -slope * d, KERPLE's log bias, ...). Distances of visible slots must be
      < D (the caller's check); larger ones read column D - 1.
    relative_table: (cos, sin), each [D, H/2] float32 indexed by the distance
      q_pos - k_pos, or None: q and k are then un-rotated and the scores
      rotary from distances (see docs/kernels.md). Distances of
      visible slots must be < D (the caller's check,
      `positions.check_table_size`); larger ones read row D - 1.
    window: sliding-window length (query at p sees p - window < pos <= p), or
      None for global attention.
    block_sizes: tile sizes and warps (numerics-relevant, keep fixed); None =
      the default of q's dtype and G (`default_block_sizes`). S must be a
      multiple of block_k.
    precision: of both matmuls (`dots`); HIGHEST = IEEE float32 for float32
      inputs; a split name (float32 only) also leaves the relative score,
      which is no matmul, in IEEE float32.
    num_stages: Triton software pipelining of the split kernel's K/V loads
      (speed only); None = 2 for 16-bit inputs, 1 for float32 (two stages of
      float32 K and V tiles may overflow shared memory).
    combine_stages: the same for the combine kernel's loads of partials.
    skip_masked_tiles: walk only the KV tiles that a program's rows may see
      (`tile_ranges`) instead of all S / block_k (a pure speed knob: the bits
      are the same either way).
    max_query_tokens: queries are processed in slices of at most this many
      tokens, bounding the float32 partials ([T * N, S / block_s, H]); rows
      are independent, so a pure memory knob.
    interpret: run the kernels in the Pallas interpreter (CPU).

  Returns:
    [B, T, N, H] in q's dtype; rows that see no slot are 0.
  """
  sizes, combine_cols = _check_arguments(
    q,
    k,
    v,
    q_positions,
    k_positions,
    q_segments,
    k_segments,
    distance_bias,
    relative_table,
    window=window,
    block_sizes=block_sizes,
    max_query_tokens=max_query_tokens,
    interpret=interpret,
  )
  dots.check(precision)
  num_q = q.shape[1]
  if num_stages is None:
    num_stages = 1 if q.dtype.itemsize > 2 else 2
  stages = (num_stages, combine_stages)

  q_positions = q_positions.astype(jnp.int32)
  k_positions = k_positions.astype(jnp.int32)
  if q_segments is not None:
    q_segments = q_segments.astype(jnp.int32)
    k_segments = k_segments.astype(jnp.int32)
  if relative_table is not None:
    relative_table = tuple(t.astype(jnp.float32) for t in relative_table)
  if distance_bias is not None:
    distance_bias = distance_bias.astype(jnp.float32)
  # Pad queries to whole programs; pad rows see nothing and are dropped.
  padded = pl.cdiv(num_q, sizes.block_q) * sizes.block_q
  pad_q = ((0, 0), (0, padded - num_q))
  q = jnp.pad(q, pad_q + ((0, 0), (0, 0)))
  q_positions = jnp.pad(q_positions, pad_q, constant_values=-1)
  if q_segments is not None:
    q_segments = jnp.pad(q_segments, pad_q)
  # Rows are independent: slices of whole query blocks change no bit.
  step = max_query_tokens // sizes.block_q * sizes.block_q
  pieces = []
  for start in range(0, padded, step):
    part = slice(start, min(start + step, padded))
    pieces.append(
      _attention_blocks(
        q[:, part],
        k,
        v,
        q_positions[:, part],
        k_positions,
        None if q_segments is None else q_segments[:, part],
        k_segments,
        distance_bias,
        relative_table,
        window=window,
        sizes=sizes,
        precision=precision,
        skip_masked_tiles=skip_masked_tiles,
        stages=stages,
        combine_cols=combine_cols,
        interpret=interpret,
      )
    )
  out = pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=1)
  return out[:, :num_q]


def _attention_blocks(
  q,
  k,
  v,
  q_positions,
  k_positions,
  q_segments,
  k_segments,
  distance_bias,
  relative_table,
  *,
  window,
  sizes,
  precision,
  skip_masked_tiles,
  stages,
  combine_cols,
  interpret,
):
  """`attention` of whole query blocks: q [B, Tp, N, H], Tp % block_q == 0."""
  batch, padded, num_heads, head_dim = q.shape
  _, capacity, num_kv_heads, _ = k.shape
  group = num_heads // num_kv_heads
  rows = sizes.block_q * group
  num_blocks = padded // sizes.block_q
  num_tiles = capacity // sizes.block_k
  tiles_per_split = sizes.block_s // sizes.block_k
  num_splits = pl.cdiv(num_tiles, tiles_per_split)
  # The combine loads all maxima at once and the rest `combine_group` splits
  # at a time: pad the partials (never written, never read) to a power of 2.
  padded_splits = max(sizes.combine_group, 1 << (num_splits - 1).bit_length())
  # [B, Tp, K*G, H] -> [B, K, Tp*G, H]: row t*G + g is head g of token t
  # (a pure reshape when K == 1); per-row operands follow the same layout.
  q_rows = q.reshape(batch, padded, num_kv_heads, group, head_dim)
  q_rows = q_rows.transpose(0, 2, 1, 3, 4)
  q_rows = q_rows.reshape(batch, num_kv_heads, padded * group, head_dim)
  q_pos_rows = jnp.repeat(q_positions, group, axis=1)  # [B, Tp*G]
  q_seg_rows = None
  if q_segments is not None:
    q_seg_rows = jnp.repeat(q_segments, group, axis=1)
  bias_rows = None
  if distance_bias is not None:
    # Row t*G + g of kv head h is query head h*G + g, whatever t: kv head h
    # reads its G heads' tables, flat [K, G*D], at g*D + distance.
    bias_rows = distance_bias.reshape(num_kv_heads, -1)

  # Which KV tiles each program walks: only a speed matter, never the bits.
  if skip_masked_tiles:
    tiles = tile_ranges(
      q_positions, k_positions, window=window, block_q=sizes.block_q, block_k=sizes.block_k
    )
  else:
    tiles = jnp.broadcast_to(jnp.array([0, num_tiles], jnp.int32), (batch, num_blocks, 2))
  split_params, combine_params = (
    (None, None) if interpret else (_common.gpu_compiler_params(sizes.num_warps, n) for n in stages)
  )

  # Kernel 1: a partial online softmax per (query block, split). Query blocks
  # vary fastest, so programs that share KV tiles run together (L2).
  row_spec = pl.BlockSpec((None, rows), lambda i, b, h, c: (b, i))
  slot_spec = pl.BlockSpec((None, capacity), lambda i, b, h, c: (b, 0))
  cache_spec = pl.BlockSpec((None, capacity, None, head_dim), lambda i, b, h, c: (b, 0, h, 0))
  table_spec = None
  if relative_table is not None:  # whole tables, read by gather
    whole = pl.BlockSpec(relative_table[0].shape, lambda i, b, h, c: (0, 0))
    table_spec = (whole, whole)
  stat_shape = (batch, num_kv_heads, padded_splits, padded * group)
  stat_spec = pl.BlockSpec((None, None, None, rows), lambda i, b, h, c: (b, h, c, i))
  m, l, o = pl.pallas_call(
    functools.partial(
      split_kernel,
      block_k=sizes.block_k,
      block_h=sizes.block_h,
      tiles_per_split=tiles_per_split,
      window=window,
      group=group,
      precision=precision,
    ),
    grid=(num_blocks, batch, num_kv_heads, num_splits),
    in_specs=[
      pl.BlockSpec((None, None, rows, head_dim), lambda i, b, h, c: (b, h, i, 0)),
      row_spec,
      None if q_seg_rows is None else row_spec,
      None
      if bias_rows is None
      else pl.BlockSpec((None, bias_rows.shape[1]), lambda i, b, h, c: (h, 0)),
      cache_spec,
      cache_spec,
      slot_spec,
      None if k_segments is None else slot_spec,
      table_spec,
      pl.BlockSpec((None, None, 2), lambda i, b, h, c: (b, i, 0)),
    ],
    out_specs=[
      stat_spec,
      stat_spec,
      pl.BlockSpec((None, None, None, rows, head_dim), lambda i, b, h, c: (b, h, c, i, 0)),
    ],
    out_shape=[
      jax.ShapeDtypeStruct(stat_shape, jnp.float32),
      jax.ShapeDtypeStruct(stat_shape, jnp.float32),
      jax.ShapeDtypeStruct(stat_shape + (head_dim,), jnp.float32),
    ],
    compiler_params=split_params,
    interpret=interpret,
    name='graftjax_attention_splits',
  )(q_rows, q_pos_rows, q_seg_rows, bias_rows, k, v, k_positions, k_segments, relative_table, tiles)

  # Kernel 2: sum each query block's splits in ascending order, a program
  # per `combine_cols` head dims.
  all_stats = pl.BlockSpec((None, None, padded_splits, rows), lambda i, b, h, j: (b, h, 0, i))
  out = pl.pallas_call(
    functools.partial(combine_kernel, tiles_per_split=tiles_per_split, group=sizes.combine_group),
    grid=(num_blocks, batch, num_kv_heads, head_dim // combine_cols),
    in_specs=[
      pl.BlockSpec((None, None, 2), lambda i, b, h, j: (b, i, 0)),
      all_stats,
      all_stats,
      pl.BlockSpec(
        (None, None, padded_splits, rows, combine_cols), lambda i, b, h, j: (b, h, 0, i, j)
      ),
    ],
    out_specs=pl.BlockSpec((None, None, rows, combine_cols), lambda i, b, h, j: (b, h, i, j)),
    out_shape=jax.ShapeDtypeStruct(q_rows.shape, q.dtype),
    compiler_params=combine_params,
    interpret=interpret,
    name='graftjax_attention_combine',
  )(tiles, m, l, o)
  out = out.reshape(batch, num_kv_heads, padded, group, head_dim)
  return out.transpose(0, 2, 1, 3, 4).reshape(batch, padded, num_heads, head_dim)
