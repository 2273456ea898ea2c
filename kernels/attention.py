"""Causal attention of a chunk of queries over a fixed-capacity KV cache.

  out[b, t, n] = softmax_j(q[b, t, n] . k[b, j, n // G]) v[b, j, n // G]

over the slots j that query (b, t) may see: slot j is visible iff it is
written (`k_positions[b, j] >= 0`), not in the future
(`k_positions[b, j] <= q_positions[b, t]`) and, for sliding-window layers,
inside the window (`q_positions[b, t] - k_positions[b, j] < window`). The
cache is the whole capacity S; slots are not assumed sorted by position.

Why the bits of one query row do not depend on anything but that row, its
position and the visible keys (the chunk-invariance the graft relies on):

* One program owns `block_q` query tokens times the G query heads that share
  a kv head, i.e. a fixed [block_q * G, H] tile; the tile size never adapts to
  T. The wrapper pads T up to a multiple of `block_q` (pad rows have position
  -1, see nothing and are sliced off), so a row is computed by the same code
  whether it arrives alone, in a chunk of 7 or of 64, and whatever its batch.
* The cache is walked in KV tiles of one fixed size `block_k`, anchored at
  absolute slot multiples (tile i is slots [i * block_k, (i + 1) * block_k)),
  in ascending order, with an online softmax in float32. There is no split
  over S, so nothing depends on how full the cache is or on its length.
* A tile that a row cannot see at all is an exact no-op for that row: its
  running max, sum and accumulator are carried through a `where` untouched.
  So a program may walk any superset of the tiles its rows see: it walks
  the range [lo, hi) from `tile_ranges` (block and tile min/max positions,
  computed beside the kernel), and which other rows share the program, or
  how full the cache is, does not matter. Probabilities of hidden slots are
  set to exactly 0 with a `where` (never via exp(-inf) arithmetic), so
  garbage in empty slots cannot leak in as long as it is finite.
* Every matmul states its precision and accumulates in float32: with
  `precision=HIGHEST`, a float32 dot is full IEEE float32 (in Triton the
  default would be TF32), a bfloat16 dot multiplies exactly and accumulates
  in float32. The probabilities are cast to v's dtype before p @ v, as in any
  flash kernel (a no-op for float32 caches).
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
  """Tile sizes of the attention kernel.

  Both are part of the numerics: fresh and grafted paths must use the same
  values (the defaults) for their bits to agree.

  Attributes:
    block_q: query tokens per program; a program holds block_q * G query rows
      (G = query heads per kv head).
    block_k: cache slots per KV tile; the capacity S must be a multiple.
  """

  block_q: int = 16
  block_k: int = 64


DEFAULT_BLOCK_SIZES = BlockSizes()


def visible(q_pos: jax.Array, k_pos: jax.Array, window: int | None) -> jax.Array:
  """Which keys a query sees; broadcasts q_pos against k_pos.

  Args:
    q_pos: int32 query positions, e.g. [..., T, 1].
    k_pos: int32 slot positions, -1 for an empty slot, e.g. [..., 1, S].
    window: sliding-window length, or None for a global layer.

  Returns:
    bool, the broadcast shape: k_pos >= 0 & k_pos <= q_pos
    (& q_pos - k_pos < window).
  """
  mask = (k_pos >= 0) & (k_pos <= q_pos)
  if window is not None:
    mask = mask & (q_pos - k_pos < window)
  return mask


def _attention_kernel(
    q_ref,  # [R, H], R = block_q * G query rows
    q_pos_ref,  # [R] int32
    k_ref,  # [S, H]
    v_ref,  # [S, H]
    k_pos_ref,  # [S] int32
    tiles_ref,  # [2] int32: this program visits KV tiles [lo, hi)
    o_ref,  # [R, H]
    *,
    block_k: int,
    window: int | None,
    precision: lax.Precision,
):
  rows, head_dim = q_ref.shape
  q = q_ref[...]
  q_pos = q_pos_ref[...]

  def body(tile, carry):
    """One online-softmax step; rows that see nothing in the tile keep carry."""
    o, m, l = carry
    slots = pl.ds(pl.multiple_of(tile * block_k, block_k), block_k)
    mask = visible(q_pos[:, None], k_pos_ref[slots][None, :], window)
    k = k_ref[slots, :]
    v = v_ref[slots, :]
    s = lax.dot_general(
        q, k, (((1,), (1,)), ((), ())),
        precision=precision, preferred_element_type=jnp.float32,
    )  # [R, block_k]
    s = jnp.where(mask, s, -jnp.inf)
    row_live = jnp.max(mask.astype(jnp.int32), axis=1) > 0  # [R]
    m_next = jnp.maximum(m, jnp.max(s, axis=1))  # == m where not live
    # exp(-inf - finite) = 0 on a row's first live tile; hidden slots get an
    # exact 0 whatever their (finite or not) logits.
    alpha = jnp.exp(m - m_next)
    p = jnp.where(mask, jnp.exp(s - m_next[:, None]), 0.0)
    pv = lax.dot_general(
        p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
        precision=precision, preferred_element_type=jnp.float32,
    )  # [R, H]
    l_next = jnp.where(row_live, alpha * l + jnp.sum(p, axis=1), l)
    o_next = jnp.where(row_live[:, None], alpha[:, None] * o + pv, o)
    return o_next, m_next, l_next

  o = jnp.zeros((rows, head_dim), jnp.float32)
  m = jnp.full((rows,), -jnp.inf, jnp.float32)
  l = jnp.zeros((rows,), jnp.float32)
  o, m, l = lax.fori_loop(tiles_ref[0], tiles_ref[1], body, (o, m, l))
  has_keys = l > 0.0
  out = jnp.where(
      has_keys[:, None], o / jnp.where(has_keys, l, 1.0)[:, None], 0.0
  )
  o_ref[...] = out.astype(o_ref.dtype)


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




@functools.partial(
    jax.jit,
    static_argnames=(
        'window', 'block_q', 'block_k', 'precision', 'num_warps',
        'num_stages', 'skip_masked_tiles', 'interpret',
    ),
)
def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_positions: jax.Array,
    k_positions: jax.Array,
    *,
    window: int | None = None,
    block_q: int = DEFAULT_BLOCK_SIZES.block_q,
    block_k: int = DEFAULT_BLOCK_SIZES.block_k,
    precision: lax.Precision = _HIGHEST,
    num_warps: int = 8,
    num_stages: int | None = None,
    skip_masked_tiles: bool = True,
    interpret: bool = False,
) -> jax.Array:
  """Causal, optionally windowed, multi-query attention over the cache.

  Args:
    q: [B, T, N, H] queries, already scaled and rotated.
    k: [B, S, K, H] keys of the whole cache capacity S (N = K * G).
    v: [B, S, K, H] values.
    q_positions: [B, T] int32 position of each query.
    k_positions: [B, S] int32 position of each slot, -1 for an empty slot.
    window: sliding-window length (query at p sees p - window < pos <= p), or
      None for global attention.
    block_q: query tokens per program (numerics-relevant, keep fixed).
    block_k: slots per KV tile; S must be a multiple (numerics-relevant).
    precision: of both matmuls; HIGHEST = IEEE float32 for float32 inputs.
    num_warps: Triton only.
    num_stages: Triton only; None = 2 for 16-bit inputs, 1 for float32
      (two stages of [block_k, 256] float32 K and V tiles overflow shared
      memory).
    skip_masked_tiles: walk only the KV tiles that a program's rows may see
      (`tile_ranges`) instead of all S / block_k (a pure speed knob: the bits
      are the same either way).
    interpret: run the kernel in the Pallas interpreter (CPU).

  Returns:
    [B, T, N, H] in q's dtype; rows that see no slot are 0.
  """
  if q.ndim != 4 or k.ndim != 4:
    raise ValueError(
        f'q must be [B, T, N, H] and k [B, S, K, H], got q {q.shape}'
        f' and k {k.shape}'
    )
  batch, num_q, num_heads, head_dim = q.shape
  _, capacity, num_kv_heads, _ = k.shape
  if v.shape != k.shape:
    raise ValueError(f'v {v.shape} must have the shape of k {k.shape}')
  if k.shape[0] != batch or k.shape[3] != head_dim:
    raise ValueError(
        f'k {k.shape} must match q {q.shape} in batch and head dim'
    )
  if num_heads % num_kv_heads:
    raise ValueError(
        f'query heads N={num_heads} must be a multiple of kv heads'
        f' K={num_kv_heads}'
    )
  if q_positions.shape != (batch, num_q):
    raise ValueError(
        f'q_positions {q_positions.shape} must be [B, T] = {(batch, num_q)}'
    )
  if k_positions.shape != (batch, capacity):
    raise ValueError(
        f'k_positions {k_positions.shape} must be [B, S] = {(batch, capacity)}'
    )
  if not (q.dtype == k.dtype == v.dtype):
    raise ValueError(
        f'q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}'
    )
  if block_q <= 0 or block_k <= 0:
    raise ValueError(f'block sizes must be positive: {block_q=} {block_k=}')
  if capacity % block_k:
    raise ValueError(
        f'cache capacity S={capacity} must be a multiple of {block_k=}'
    )
  if window is not None and window <= 0:
    raise ValueError(f'window must be positive or None, got {window}')
  group = num_heads // num_kv_heads
  rows = block_q * group
  if num_stages is None:
    num_stages = 2 if q.dtype.itemsize <= 2 else 1
  if not interpret:
    for name, size in (('block_q * G', rows), ('block_k', block_k),
                       ('head dim H', head_dim)):
      if not _common.is_power_of_2(size) or size < 16:
        raise ValueError(
            f'{name}={size} must be a power of 2 and >= 16 for the GPU kernel'
        )

  q_positions = q_positions.astype(jnp.int32)
  k_positions = k_positions.astype(jnp.int32)
  # Pad queries to whole programs; pad rows see nothing and are dropped.
  padded = pl.cdiv(num_q, block_q) * block_q
  if padded != num_q:
    q = jnp.pad(q, ((0, 0), (0, padded - num_q), (0, 0), (0, 0)))
    q_positions = jnp.pad(
        q_positions, ((0, 0), (0, padded - num_q)), constant_values=-1
    )
  # [B, Tp, K*G, H] -> [B, K, Tp*G, H]: row t*G + g is head g of token t
  # (a pure reshape when K == 1).
  q_rows = q.reshape(batch, padded, num_kv_heads, group, head_dim)
  q_rows = q_rows.transpose(0, 2, 1, 3, 4)
  q_rows = q_rows.reshape(batch, num_kv_heads, padded * group, head_dim)
  q_pos_rows = jnp.repeat(q_positions, group, axis=1)

  # Which KV tiles each program walks: only a speed matter, never the bits.
  if skip_masked_tiles:
    tiles = tile_ranges(q_positions, k_positions, window=window,
                        block_q=block_q, block_k=block_k)
  else:
    tiles = jnp.broadcast_to(
        jnp.array([0, capacity // block_k], jnp.int32),
        (batch, padded // block_q, 2))
  kernel = functools.partial(
      _attention_kernel, block_k=block_k, window=window, precision=precision
  )
  # Query blocks vary fastest, so programs that share a kv head run together
  # and their K/V tiles stay in L2.
  grid = (padded // block_q, batch, num_kv_heads)
  out = pl.pallas_call(
      kernel,
      grid=grid,
      in_specs=[
          pl.BlockSpec((None, None, rows, head_dim),
                       lambda i, b, h: (b, h, i, 0)),
          pl.BlockSpec((None, rows), lambda i, b, h: (b, i)),
          pl.BlockSpec((None, capacity, None, head_dim),
                       lambda i, b, h: (b, 0, h, 0)),
          pl.BlockSpec((None, capacity, None, head_dim),
                       lambda i, b, h: (b, 0, h, 0)),
          pl.BlockSpec((None, capacity), lambda i, b, h: (b, 0)),
          pl.BlockSpec((None, None, 2), lambda i, b, h: (b, i, 0)),
      ],
      out_specs=pl.BlockSpec((None, None, rows, head_dim),
                             lambda i, b, h: (b, h, i, 0)),
      out_shape=jax.ShapeDtypeStruct(q_rows.shape, q.dtype),
      compiler_params=(
          None if interpret else _common.gpu_compiler_params(num_warps, num_stages)
      ),
      interpret=interpret,
      name='graftjax_attention',
  )(q_rows, q_pos_rows, k, v, k_positions, tiles)
  out = out.reshape(batch, num_kv_heads, padded, group, head_dim)
  out = out.transpose(0, 2, 1, 3, 4).reshape(batch, padded, num_heads, head_dim)
  return out[:, :num_q]


@functools.partial(jax.jit, static_argnames=('window', 'precision'))
def attention_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_positions: jax.Array,
    k_positions: jax.Array,
    *,
    window: int | None = None,
    precision: lax.Precision = _HIGHEST,
) -> jax.Array:
  """Plain masked softmax in float32; same contract as `attention`.

  Not chunk-invariant on XLA (its bits depend on T and S); a yardstick only.
  """
  batch, num_q, num_heads, head_dim = q.shape
  num_kv_heads = k.shape[2]
  group = num_heads // num_kv_heads
  qg = q.astype(jnp.float32).reshape(
      batch, num_q, num_kv_heads, group, head_dim
  )
  s = jnp.einsum(
      'BTKGH,BSKH->BKGTS', qg, k.astype(jnp.float32), precision=precision
  )
  mask = visible(
      q_positions[:, :, None].astype(jnp.int32),
      k_positions[:, None, :].astype(jnp.int32),
      window,
  )[:, None, None]  # [B, 1, 1, T, S]
  s = jnp.where(mask, s, -jnp.inf)
  m = jnp.max(s, axis=-1, keepdims=True)
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  p = jnp.where(mask, jnp.exp(s - m), 0.0)
  l = jnp.sum(p, axis=-1, keepdims=True)
  w = jnp.where(l > 0, p / jnp.where(l > 0, l, 1.0), 0.0)
  out = jnp.einsum(
      'BKGTS,BSKH->BTKGH', w, v.astype(jnp.float32), precision=precision
  )
  return out.reshape(batch, num_q, num_heads, head_dim).astype(q.dtype)
