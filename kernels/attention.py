"""Causal attention of a chunk of queries over a fixed-capacity KV cache.

  out[b, t, n] = softmax_j(score(b, t, n, j)) v[b, j, n // G]

over the slots j that query (b, t) may see: slot j is visible iff it is
written (`k_positions[b, j] >= 0`), not in the future
(`k_positions[b, j] <= q_positions[b, t]`), for sliding-window layers inside
the window (`q_positions[b, t] - k_positions[b, j] < window`) and, with
segments, in the query's segment or the query is in segment 0
(`q_segments[b, t] == 0 | q_segments[b, t] == k_segments[b, j]`). The cache
is the whole capacity S; slots are not assumed sorted by position.

With d = q_positions[b, t] - k_positions[b, j] (an integer), the score is

  q[b, t, n] . k[b, j, n // G]                      (queries/keys pre-rotated)
  sum_i a_i cos[d, i] + b_i sin[d, i]               (`relative_table`)
      a = q1 k1 + q2 k2,  b = q1 k2 - q2 k1,  q1/q2 = q[:H/2]/q[H/2:] (NEOX)
  ... - alibi_slopes[n] * float32(d)                (`alibi_slopes`, added)

The relative form is rotary attention of un-rotated queries and keys with
cos/sin read from a table indexed by the distance alone, so every arithmetic
input is a function of d and moving a whole context by M changes no bit.

Why the bits of one query row do not depend on anything but that row, its
position (and segment) and the visible keys (the chunk-invariance the graft
relies on):

* One program owns `block_q` query tokens times the G query heads that share
  a kv head, i.e. a fixed [block_q * G, H] tile; the tile size never adapts to
  T. The wrapper pads T up to a multiple of `block_q` (pad rows have position
  -1 and segment 0, see nothing and are sliced off), so a row is computed by
  the same code whether it arrives alone, in a chunk of 7 or of 64, and
  whatever its batch. Per-row operands (positions, segments, ALiBi slopes)
  are laid out like the rows.
* The cache is walked in KV tiles of one fixed size `block_k`, anchored at
  absolute slot multiples (tile i is slots [i * block_k, (i + 1) * block_k)).
  The tiles are grouped into splits of `block_s` slots, again anchored at
  absolute multiples (split c is tiles [c * n, (c + 1) * n), n = block_s /
  block_k). A first kernel computes, for each (query block, split), an online
  softmax in float32 over the split's tiles in ascending order: a partial
  (max m, sum l, unnormalised output o). A second kernel rescales the
  partials of one query block to their largest max (a max is exact in any
  order) and sums them in ascending split order, then normalises. The
  splits run in parallel (a single decoded token over S slots gets
  S / block_s programs, not one), yet nothing depends on T or on how full
  the cache is: every row gets the same tiles, the same splits and the same
  sum whether it arrives in a prefill chunk or alone.
* A tile that a row cannot see at all is an exact no-op for that row: its
  running max, sum and accumulator are carried through a `where` untouched;
  likewise a split in which a row sees nothing (l = 0) adds an exact 0 to
  the sum. So a program may walk any superset of the tiles its rows see: it
  walks the range [lo, hi) from `tile_ranges` (block and tile min/max
  positions, computed beside the kernel; segments only hide more)
  intersected with its split, and the sum visits the splits that range
  touches. Which other rows share the program, or how full the cache is,
  does not matter.
  Probabilities of hidden slots are set to exactly 0 with a `where` (never
  via exp(-inf) arithmetic), so garbage in empty slots cannot leak in as
  long as it is finite.
* Every matmul states its precision and accumulates in float32: with
  `precision=HIGHEST`, a float32 dot is full IEEE float32 (in Triton the
  default would be TF32), a bfloat16 dot multiplies exactly and accumulates
  in float32. The probabilities are cast to v's dtype before p @ v, as in any
  flash kernel (a no-op for float32 caches).
* The relative score is no matmul: cos/sin differ per (row, slot), so each
  KV tile gathers their table rows by the tile's distances,
  `cos_ref[d, i0:i0 + block_h]` -> [block_q * G, block_k, block_h], and sums
  a cos + b sin elementwise in float32, `block_h` head-dim pairs per step of
  a fixed loop over H / 2 (so the order of the sum is fixed too). The tables
  are passed whole (one block covering [D, H/2]) and read with an integer
  array index: on the GPU a gather from global memory (a pointer load of
  the computed offsets in Triton), in the interpreter an XLA gather. Tables
  of cos/sin per tile built outside the kernel would cost [T * G, S, H/2]
  per call; anything indexed by absolute position (cos(p) cos(k) +
  sin(p) sin(k)) would break exact relocation. d is clamped to [0, D - 1]
  for the gather only: hidden slots may have any distance, and a visible
  distance >= D would read row D - 1, so the caller sizes the table
  (`positions.check_table_size`).
* A row that sees no slot at all returns exactly 0, not NaN.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from graftjax.kernels import _common

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
      parallelism over S, summed in ascending order.
    block_h: head-dim pairs per step of the relative (`relative_table`)
      score, a [block_q * G, block_k, block_h] gather; H / 2 must be a
      multiple.
    num_warps: Triton warps per program; the layout, hence the order of the
      cross-thread sums, depends on it.
  """

  block_q: int = 4
  block_k: int = 64
  block_s: int = 512
  block_h: int = 8
  num_warps: int = 4


# Query rows per program (block_q * G). Few rows suit decode (one token) and
# keep float32 operands, whose IEEE dots run on CUDA cores, in registers.
_ROWS = 16
# Per compute dtype, measured with experiments/bench_attention_tiles.py
# (experiments/results/bench_attention_tiles_h200.json); block_q follows from G.
_DEFAULTS = {
  'bfloat16': BlockSizes(block_k=64, block_s=512),
  'float16': BlockSizes(block_k=64, block_s=512),
  'float32': BlockSizes(block_k=32, block_s=256),
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


def visible(
  q_pos: jax.Array,
  k_pos: jax.Array,
  window: int | None,
  q_seg: jax.Array | None = None,
  k_seg: jax.Array | None = None,
) -> jax.Array:
  """Which keys a query sees; broadcasts query operands against key operands.

  Args:
    q_pos: int32 query positions, e.g. [..., T, 1].
    k_pos: int32 slot positions, -1 for an empty slot, e.g. [..., 1, S].
    window: sliding-window length, or None for a global layer.
    q_seg: int32 query segments shaped like q_pos, or None (no segments).
    k_seg: int32 slot segments shaped like k_pos; given iff q_seg is.

  Returns:
    bool, the broadcast shape: k_pos >= 0 & k_pos <= q_pos
    (& q_pos - k_pos < window) (& (q_seg == 0 | q_seg == k_seg)).
  """
  mask = (k_pos >= 0) & (k_pos <= q_pos)
  if window is not None:
    mask = mask & (q_pos - k_pos < window)
  if q_seg is not None:
    mask = mask & ((q_seg == 0) | (q_seg == k_seg))
  return mask


def _relative_scores(q_ref, k_ref, slots, distance, cos_ref, sin_ref, *, block_h: int) -> jax.Array:
  """[R, block_k] float32 rotary scores of un-rotated q and k from distances.

  Args:
    q_ref: [R, H] queries.
    k_ref: [S, H] keys; `slots` selects the tile.
    slots: the tile's slot range.
    distance: [R, block_k] int32 q_pos - k_pos.
    cos_ref, sin_ref: [D, H/2] float32, indexed by distance.
    block_h: head-dim pairs per step.
  """
  rows, head_dim = q_ref.shape
  half = head_dim // 2
  index = jnp.clip(distance, 0, cos_ref.shape[0] - 1)

  def step(c, s):
    first = pl.ds(pl.multiple_of(c * block_h, block_h), block_h)
    second = pl.ds(pl.multiple_of(half + c * block_h, block_h), block_h)
    q1 = q_ref[:, first].astype(jnp.float32)[:, None, :]  # [R, 1, block_h]
    q2 = q_ref[:, second].astype(jnp.float32)[:, None, :]
    k1 = k_ref[slots, first].astype(jnp.float32)[None]  # [1, block_k, block_h]
    k2 = k_ref[slots, second].astype(jnp.float32)[None]
    a = q1 * k1 + q2 * k2  # [R, block_k, block_h]
    b = q1 * k2 - q2 * k1
    terms = a * cos_ref[index, first] + b * sin_ref[index, first]
    return s + jnp.sum(terms, axis=2)

  return lax.fori_loop(0, half // block_h, step, jnp.zeros((rows, index.shape[1]), jnp.float32))


def _split_kernel(
  q_ref,  # [R, H], R = block_q * G query rows
  q_pos_ref,  # [R] int32
  q_seg_ref,  # [R] int32, or None
  slope_ref,  # [R] float32 ALiBi slope of each row's head, or None
  k_ref,  # [S, H]
  v_ref,  # [S, H]
  k_pos_ref,  # [S] int32
  k_seg_ref,  # [S] int32, or None
  table_refs,  # (cos, sin) [D, H/2] float32, or None
  tiles_ref,  # [2] int32: the query block may see KV tiles [lo, hi)
  m_ref,  # [R] float32 out: running max of the split
  l_ref,  # [R] float32 out: sum of exp(s - m) of the split
  o_ref,  # [R, H] float32 out: unnormalised output of the split
  *,
  block_k: int,
  block_h: int,
  tiles_per_split: int,
  window: int | None,
  precision: lax.Precision,
):
  """Online softmax of one query block over the tiles of one split."""
  rows, head_dim = q_ref.shape
  split = pl.program_id(3)
  q = q_ref[...] if table_refs is None else None
  lo = jnp.maximum(tiles_ref[0], split * tiles_per_split)
  hi = jnp.minimum(tiles_ref[1], (split + 1) * tiles_per_split)
  q_pos = q_pos_ref[...]
  q_seg = None if q_seg_ref is None else q_seg_ref[...][:, None]
  neg_slope = None if slope_ref is None else -slope_ref[...][:, None]

  def body(tile, carry):
    """One online-softmax step; rows that see nothing in the tile keep carry."""
    o, m, l = carry
    slots = pl.ds(pl.multiple_of(tile * block_k, block_k), block_k)
    k_pos = k_pos_ref[slots]
    k_seg = None if k_seg_ref is None else k_seg_ref[slots][None, :]
    mask = visible(q_pos[:, None], k_pos[None, :], window, q_seg, k_seg)
    distance = q_pos[:, None] - k_pos[None, :]  # [R, block_k] int32
    if table_refs is None:
      s = lax.dot_general(
        q,
        k_ref[slots, :],
        (((1,), (1,)), ((), ())),
        precision=precision,
        preferred_element_type=jnp.float32,
      )  # [R, block_k]
    else:
      s = _relative_scores(q_ref, k_ref, slots, distance, *table_refs, block_h=block_h)
    if neg_slope is not None:
      s = s + neg_slope * distance.astype(jnp.float32)
    s = jnp.where(mask, s, -jnp.inf)
    v = v_ref[slots, :]
    row_live = jnp.max(mask.astype(jnp.int32), axis=1) > 0  # [R]
    m_next = jnp.maximum(m, jnp.max(s, axis=1))  # == m where not live
    # exp(-inf - finite) = 0 on a row's first live tile; hidden slots get an
    # exact 0 whatever their (finite or not) logits.
    alpha = jnp.exp(m - m_next)
    p = jnp.where(mask, jnp.exp(s - m_next[:, None]), 0.0)
    pv = lax.dot_general(
      p.astype(v.dtype),
      v,
      (((1,), (0,)), ((), ())),
      precision=precision,
      preferred_element_type=jnp.float32,
    )  # [R, H]
    l_next = jnp.where(row_live, alpha * l + jnp.sum(p, axis=1), l)
    o_next = jnp.where(row_live[:, None], alpha[:, None] * o + pv, o)
    return o_next, m_next, l_next

  # Splits outside [lo, hi) write nothing: the sum never counts them.
  @pl.when(lo < hi)
  def _():
    o = jnp.zeros((rows, head_dim), jnp.float32)
    m = jnp.full((rows,), -jnp.inf, jnp.float32)
    l = jnp.zeros((rows,), jnp.float32)
    o, m, l = lax.fori_loop(lo, hi, body, (o, m, l))
    m_ref[...] = m
    l_ref[...] = l
    o_ref[...] = o


def _combine_kernel(
  tiles_ref,  # [2] int32: the query block may see KV tiles [lo, hi)
  m_ref,  # [Cp, R] float32 split maxima (Cp = C splits padded to `unroll`)
  l_ref,  # [Cp, R] float32 split sums
  o_ref,  # [Cp, R, Hc] float32 unnormalised split outputs, Hc head dims
  out_ref,  # [R, Hc]
  *,
  tiles_per_split: int,
  unroll: int,
):
  """Sums the splits of one query block in ascending order, then normalises.

  With M the largest maximum among the splits a row saw (exact in any
  order), out = sum_c w_c o_c / sum_c w_c l_c, w_c = exp(m_c - M), summed
  one split after the other from the first. Splits a row did not see (out
  of the block's tile range, or l_c = 0; their partials may be unwritten)
  contribute an exact 0, so the sum is the same sequence of additions
  whichever superset of splits is walked. `unroll` splits per loop step
  (loads issued together) and the Hc columns per program change no bit.
  """
  rows, head_dim = out_ref.shape
  lo, hi = tiles_ref[0], tiles_ref[1]
  first = lo // tiles_per_split
  last = jnp.where(lo < hi, pl.cdiv(hi, tiles_per_split), first)

  def live(split):
    in_range = (split >= first) & (split < last)
    return in_range & (l_ref[split] > 0.0)  # [R]

  def max_step(step, m):
    for u in range(unroll):
      split = step * unroll + u
      m = jnp.maximum(m, jnp.where(live(split), m_ref[split], -jnp.inf))
    return m

  steps = (first // unroll, pl.cdiv(last, unroll))
  m_max = lax.fori_loop(*steps, max_step, jnp.full((rows,), -jnp.inf, jnp.float32))

  def sum_step(step, carry):
    o, l = carry
    for u in range(unroll):
      split = step * unroll + u
      seen = live(split)
      w = jnp.exp(jnp.where(seen, m_ref[split] - m_max, 0.0))
      l = l + jnp.where(seen, w * l_ref[split], 0.0)
      o = o + jnp.where(seen[:, None], w[:, None] * o_ref[split], 0.0)
    return o, l

  o, l = lax.fori_loop(
    *steps, sum_step, (jnp.zeros((rows, head_dim), jnp.float32), jnp.zeros((rows,), jnp.float32))
  )
  has_keys = l > 0.0
  out = jnp.where(has_keys[:, None], o / jnp.where(has_keys, l, 1.0)[:, None], 0.0)
  out_ref[...] = out.astype(out_ref.dtype)


def tile_ranges(
  q_positions: jax.Array,
  k_positions: jax.Array,
  *,
  window: int | None,
  block_q: int,
  block_k: int,
) -> jax.Array:
  """[B, T / block_q, 2] int32: the KV tiles [lo, hi) each query block visits.

  A superset of the tiles any row of the block can see (bounds from the
  blocks' and tiles' min/max positions), so visiting it is exact: tiles in
  [lo, hi) that a row cannot see are exact no-ops for that row, and tiles
  outside it are invisible to every row of the block. (B, T) must already be
  padded to a multiple of block_q; S to a multiple of block_k.
  """
  batch, num_q = q_positions.shape
  big = jnp.iinfo(jnp.int32).max
  qb = q_positions.reshape(batch, num_q // block_q, block_q)
  q_max = jnp.max(qb, axis=-1)  # -1 if the block is all padding
  q_min = jnp.min(jnp.where(qb >= 0, qb, big), axis=-1)
  kb = k_positions.reshape(batch, -1, block_k)
  k_any = jnp.any(kb >= 0, axis=-1)
  k_min = jnp.min(jnp.where(kb >= 0, kb, big), axis=-1)
  k_max = jnp.max(kb, axis=-1)
  maybe = k_any[:, None, :] & (q_max[:, :, None] >= 0)
  maybe &= k_min[:, None, :] <= q_max[:, :, None]
  if window is not None:
    maybe &= k_max[:, None, :] > q_min[:, :, None] - window
  num_tiles = kb.shape[1]
  tiles = jnp.arange(num_tiles, dtype=jnp.int32)
  lo = jnp.min(jnp.where(maybe, tiles, num_tiles), axis=-1)
  hi = jnp.max(jnp.where(maybe, tiles + 1, 0), axis=-1)
  lo = jnp.minimum(lo, hi)  # an empty range is [hi, hi)
  return jnp.stack([lo, hi], axis=-1).astype(jnp.int32)


def _check_options(
  q: jax.Array,
  k: jax.Array,
  q_segments: jax.Array | None,
  k_segments: jax.Array | None,
  alibi_slopes: jax.Array | None,
  relative_table: tuple[jax.Array, jax.Array] | None,
  block_h: int,
) -> None:
  """Shape checks of the optional operands (ValueError with the numbers)."""
  batch, num_q, num_heads, head_dim = q.shape
  capacity = k.shape[1]
  if (q_segments is None) != (k_segments is None):
    raise ValueError('q_segments and k_segments must be given together')
  if q_segments is not None and q_segments.shape != (batch, num_q):
    raise ValueError(f'q_segments {q_segments.shape} must be [B, T] = {(batch, num_q)}')
  if k_segments is not None and k_segments.shape != (batch, capacity):
    raise ValueError(f'k_segments {k_segments.shape} must be [B, S] = {(batch, capacity)}')
  if alibi_slopes is not None and alibi_slopes.shape != (num_heads,):
    raise ValueError(f'alibi_slopes {alibi_slopes.shape} must be [N] = {(num_heads,)}')
  if relative_table is not None:
    cos, sin = relative_table
    if head_dim % 2:
      raise ValueError(f'relative scores need an even head dim, got H={head_dim}')
    if cos.ndim != 2 or cos.shape[1] != head_dim // 2 or sin.shape != cos.shape:
      raise ValueError(
        f'relative_table cos {cos.shape} and sin {sin.shape} must both be'
        f' [D, H/2] with H/2={head_dim // 2}'
      )
    if block_h <= 0 or (head_dim // 2) % block_h:
      raise ValueError(f'H/2={head_dim // 2} must be a multiple of block_h={block_h}')


@functools.partial(
  jax.jit,
  static_argnames=(
    'window',
    'block_sizes',
    'precision',
    'num_stages',
    'combine_stages',
    'combine_unroll',
    'combine_block_h',
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
  alibi_slopes: jax.Array | None = None,
  relative_table: tuple[jax.Array, jax.Array] | None = None,
  window: int | None = None,
  block_sizes: BlockSizes | None = None,
  precision: lax.Precision = _HIGHEST,
  num_stages: int | None = None,
  combine_stages: int = 1,
  combine_unroll: int = 8,
  combine_block_h: int = 64,
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
    alibi_slopes: [N] float32 ALiBi slope of each query head, or None: adds
      -slope * float32(q_pos - k_pos) to the scores.
    relative_table: (cos, sin), each [D, H/2] float32 indexed by the distance
      q_pos - k_pos, or None: q and k are then un-rotated and the scores
      rotary from distances (see the module docstring). Distances of
      visible slots must be < D (the caller's check,
      `positions.check_table_size`); larger ones read row D - 1.
    window: sliding-window length (query at p sees p - window < pos <= p), or
      None for global attention.
    block_sizes: tile sizes and warps (numerics-relevant, keep fixed); None =
      the default of q's dtype and G (`default_block_sizes`). S must be a
      multiple of block_k.
    precision: of both matmuls; HIGHEST = IEEE float32 for float32 inputs.
    num_stages: Triton software pipelining of the split kernel's K/V loads
      (speed only); None = 2 for 16-bit inputs, 1 for float32 (two stages of
      float32 K and V tiles may overflow shared memory).
    combine_stages: the same for the combine kernel's loads of partials.
    combine_unroll: splits per step of the combine kernel's loops, whose
      loads are issued together (speed only: the same additions in the same
      order).
    combine_block_h: head dims per combine program (speed only: columns are
      independent); min(combine_block_h, H) must divide H.
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
  _check_options(q, k, q_segments, k_segments, alibi_slopes, relative_table, sizes.block_h)
  if min(sizes.block_q, sizes.block_k, sizes.block_s) <= 0:
    raise ValueError(f'block sizes must be positive: {sizes}')
  if sizes.block_s % sizes.block_k:
    raise ValueError(f'block_s={sizes.block_s} must be a multiple of block_k={sizes.block_k}')
  if capacity % sizes.block_k:
    raise ValueError(f'cache capacity S={capacity} must be a multiple of block_k={sizes.block_k}')
  if window is not None and window <= 0:
    raise ValueError(f'window must be positive or None, got {window}')
  if combine_unroll <= 0:
    raise ValueError(f'combine_unroll must be positive, got {combine_unroll}')
  combine_cols = min(combine_block_h, head_dim)
  if combine_cols <= 0 or head_dim % combine_cols:
    raise ValueError(
      f'combine_block_h={combine_block_h} must be positive and divide the'
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
  if num_stages is None:
    num_stages = 1 if q.dtype.itemsize > 2 else 2
  stages = (num_stages, combine_stages)
  combine = (combine_unroll, combine_cols)

  q_positions = q_positions.astype(jnp.int32)
  k_positions = k_positions.astype(jnp.int32)
  if q_segments is not None:
    q_segments = q_segments.astype(jnp.int32)
    k_segments = k_segments.astype(jnp.int32)
  if relative_table is not None:
    relative_table = tuple(t.astype(jnp.float32) for t in relative_table)
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
        alibi_slopes,
        relative_table,
        window=window,
        sizes=sizes,
        precision=precision,
        skip_masked_tiles=skip_masked_tiles,
        stages=stages,
        combine=combine,
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
  alibi_slopes,
  relative_table,
  *,
  window,
  sizes,
  precision,
  skip_masked_tiles,
  stages,
  combine,
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
  unroll, combine_cols = combine
  # The combine reads splits `unroll` at a time: pad the partials (never
  # written, never counted) to a whole number of steps.
  padded_splits = pl.cdiv(num_splits, unroll) * unroll
  # [B, Tp, K*G, H] -> [B, K, Tp*G, H]: row t*G + g is head g of token t
  # (a pure reshape when K == 1); per-row operands follow the same layout.
  q_rows = q.reshape(batch, padded, num_kv_heads, group, head_dim)
  q_rows = q_rows.transpose(0, 2, 1, 3, 4)
  q_rows = q_rows.reshape(batch, num_kv_heads, padded * group, head_dim)
  q_pos_rows = jnp.repeat(q_positions, group, axis=1)  # [B, Tp*G]
  q_seg_rows = None
  if q_segments is not None:
    q_seg_rows = jnp.repeat(q_segments, group, axis=1)
  slope_rows = None
  if alibi_slopes is not None:
    # Row t*G + g of kv head h is query head h*G + g, whatever t: [K, R].
    slope_rows = jnp.tile(
      alibi_slopes.astype(jnp.float32).reshape(num_kv_heads, group), (1, sizes.block_q)
    )

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
      _split_kernel,
      block_k=sizes.block_k,
      block_h=sizes.block_h,
      tiles_per_split=tiles_per_split,
      window=window,
      precision=precision,
    ),
    grid=(num_blocks, batch, num_kv_heads, num_splits),
    in_specs=[
      pl.BlockSpec((None, None, rows, head_dim), lambda i, b, h, c: (b, h, i, 0)),
      row_spec,
      None if q_seg_rows is None else row_spec,
      None if slope_rows is None else pl.BlockSpec((None, rows), lambda i, b, h, c: (h, 0)),
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
  )(
    q_rows, q_pos_rows, q_seg_rows, slope_rows, k, v, k_positions, k_segments, relative_table, tiles
  )

  # Kernel 2: sum each query block's splits in ascending order, a program
  # per `combine_cols` head dims.
  all_stats = pl.BlockSpec((None, None, padded_splits, rows), lambda i, b, h, j: (b, h, 0, i))
  out = pl.pallas_call(
    functools.partial(_combine_kernel, tiles_per_split=tiles_per_split, unroll=unroll),
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


@functools.partial(jax.jit, static_argnames=('window', 'precision'))
def attention_reference(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  q_positions: jax.Array,
  k_positions: jax.Array,
  *,
  q_segments: jax.Array | None = None,
  k_segments: jax.Array | None = None,
  alibi_slopes: jax.Array | None = None,
  relative_table: tuple[jax.Array, jax.Array] | None = None,
  window: int | None = None,
  precision: lax.Precision = _HIGHEST,
) -> jax.Array:
  """Plain masked softmax in float32; same contract as `attention`.

  Not chunk-invariant on XLA (its bits depend on T and S); a yardstick only.
  """
  batch, num_q, num_heads, head_dim = q.shape
  num_kv_heads = k.shape[2]
  group = num_heads // num_kv_heads
  qg = q.astype(jnp.float32).reshape(batch, num_q, num_kv_heads, group, head_dim)
  kf = k.astype(jnp.float32)
  q_pos = q_positions[:, :, None].astype(jnp.int32)  # [B, T, 1]
  k_pos = k_positions[:, None, :].astype(jnp.int32)  # [B, 1, S]
  distance = q_pos - k_pos  # [B, T, S]
  if relative_table is None:
    s = jnp.einsum('BTKGH,BSKH->BKGTS', qg, kf, precision=precision)
  else:
    index = jnp.clip(distance, 0, relative_table[0].shape[0] - 1)
    cos, sin = (
      jnp.take(t.astype(jnp.float32), index, axis=0) for t in relative_table
    )  # [B, T, S, H/2]
    q1, q2 = jnp.split(qg, 2, axis=-1)
    k1, k2 = jnp.split(kf, 2, axis=-1)
    score = functools.partial(jnp.einsum, 'BTKGi,BSKi,BTSi->BKGTS', precision=precision)
    s = score(q1, k1, cos) + score(q2, k2, cos) + score(q1, k2, sin) - score(q2, k1, sin)
  if alibi_slopes is not None:
    neg_slopes = -alibi_slopes.astype(jnp.float32).reshape(num_kv_heads, group)
    s = s + neg_slopes[None, :, :, None, None] * distance.astype(jnp.float32)[:, None, None]
  q_seg = k_seg = None
  if q_segments is not None:
    q_seg = q_segments[:, :, None].astype(jnp.int32)
    k_seg = k_segments[:, None, :].astype(jnp.int32)
  mask = visible(q_pos, k_pos, window, q_seg, k_seg)[:, None, None]
  s = jnp.where(mask, s, -jnp.inf)
  m = jnp.max(s, axis=-1, keepdims=True)
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  p = jnp.where(mask, jnp.exp(s - m), 0.0)
  l = jnp.sum(p, axis=-1, keepdims=True)
  w = jnp.where(l > 0, p / jnp.where(l > 0, l, 1.0), 0.0)
  out = jnp.einsum('BKGTS,BSKH->BTKGH', w, v.astype(jnp.float32), precision=precision)
  return out.reshape(batch, num_q, num_heads, head_dim).astype(q.dtype)
