"""Position schemes: how a token's position enters attention.

* `rope`: queries and keys are rotated by their absolute positions
  (NEOX rotate-half), angles and cos/sin in float32 as the reference
  implementations compute them. Keys are cached rotated.
* `rope_f64`: the same rotation, with angles and cos/sin computed in float64
  on the host and cast to float32 (a table indexed by absolute position).
* `rope_relative`: keys are cached un-rotated, and a score is computed from
  the integer distance d = i - j alone:
      q_rot(i) . k_rot(j) = sum_pairs a cos(d theta) + b sin(d theta),
      a = q1 k1 + q2 k2,  b = q1 k2 - q2 k1,
  with cos/sin read from a table indexed by d. Every arithmetic input is
  independent of the absolute offset, so moving a whole context by M
  changes no bit. Equal to `rope` in exact arithmetic.
* `alibi`: no rotation; a per-head linear bias -slope_h * d on the scores.
* `nope`: no position signal at all (causality only, through the mask).

Tables are built on the host with numpy (float64) and passed to the jitted
forward pass as arguments, so they are computed once per size.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import layers

Scheme = config_lib.PositionScheme


def inverse_frequencies(head_dim: int, theta: float) -> jax.Array:
  """[H/2] float32 rotary frequencies theta^(-2i/H), as the references compute them."""
  exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
  return 1.0 / (jnp.float32(theta) ** exponents)


def rotary_cos_sin(
  positions: jax.Array, head_dim: int, theta: float
) -> tuple[jax.Array, jax.Array]:
  """float32 cos, sin [B, T, H/2] of angle = position * inverse frequency."""
  angles = positions.astype(jnp.float32)[..., None] * inverse_frequencies(head_dim, theta)
  return jnp.cos(angles), jnp.sin(angles)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """NEOX rotate-half of x [B, T, N, H] by cos, sin [B, T, H/2], in x's dtype."""
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  cos, sin = cos[..., None, :], sin[..., None, :]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


@functools.lru_cache(maxsize=16)
def _float64_table(head_dim: int, theta: float, size: int) -> tuple[np.ndarray, np.ndarray]:
  inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
  angles = np.arange(size, dtype=np.float64)[:, None] * inv_freq[None, :]
  return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def table(head_dim: int, theta: float, size: int) -> dict[str, jax.Array]:
  """cos/sin [size, H/2] of index * inverse frequency, computed in float64."""
  cos, sin = _float64_table(head_dim, float(theta), int(size))
  return {'cos': jnp.asarray(cos), 'sin': jnp.asarray(sin)}


def tables(config: config_lib.GemmaConfig, size: int) -> dict[str, dict[str, jax.Array]] | None:
  """Host-computed tables a scheme needs, keyed by rope theta; None if none.

  For `rope_f64` the index is an absolute position, so `size` must exceed
  every position used; for `rope_relative` it is a distance, so `size` must
  exceed every distance between a query and a visible key.
  """
  if config.position_scheme not in (Scheme.ROPE_F64, Scheme.ROPE_RELATIVE):
    return None
  thetas = sorted({config.local_rope_theta, config.global_rope_theta})
  return {theta_key(t): table(config.head_dim, t, size) for t in thetas}


def theta_key(theta: float) -> str:
  return f'theta_{theta:g}'


def _lookup(tab: dict[str, jax.Array], index: jax.Array) -> tuple[jax.Array, jax.Array]:
  size = tab['cos'].shape[0]
  index = jnp.clip(index, 0, size - 1)
  return jnp.take(tab['cos'], index, axis=0), jnp.take(tab['sin'], index, axis=0)


def check_table_size(tabs, needed: int) -> None:
  """Raises ValueError if a position/distance table is too small (host side)."""
  if tabs is None:
    return
  size = next(iter(tabs.values()))['cos'].shape[0]
  if needed >= size:
    raise ValueError(f'position table of {size} rows cannot index {needed}; build it larger')


def rotate_for_cache(
  x: jax.Array,
  positions: jax.Array,
  *,
  scheme: Scheme,
  theta: float,
  tabs=None,
) -> jax.Array:
  """Applies the scheme's rotation to queries or keys [B, T, N, H] at positions [B, T].

  Identity for schemes that do not rotate (`rope_relative` caches raw keys).
  """
  if scheme == Scheme.ROPE:
    return rotate(x, *rotary_cos_sin(positions, x.shape[-1], theta))
  if scheme == Scheme.ROPE_F64:
    return rotate(x, *_lookup(tabs[theta_key(theta)], positions))
  return x


def relocate_keys(k: jax.Array, delta: int, *, scheme: Scheme, theta: float) -> jax.Array:
  """Re-rotates cached keys [..., n, K, H] by `delta` positions (K-shift).

  For `rope`, R(p + delta) k is approximated by R(delta) R(p) k, as llama.cpp's
  K-shift and CacheBlend do; the result is not bit-equal to a fresh rotation.
  For schemes whose cached keys carry no absolute position, keys are
  returned as they are.
  """
  if scheme not in (Scheme.ROPE, Scheme.ROPE_F64):
    return k
  head_dim = k.shape[-1]
  if scheme == Scheme.ROPE:
    cos, sin = rotary_cos_sin(jnp.full((1, 1), delta, jnp.int32), head_dim, theta)
  else:
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    cos = jnp.asarray(np.cos(delta * inv_freq).astype(np.float32))[None, None]
    sin = jnp.asarray(np.sin(delta * inv_freq).astype(np.float32))[None, None]
  flat = k.reshape((1, -1) + k.shape[-2:])  # every cached row shifts by the same delta
  return rotate(flat, cos, sin).reshape(k.shape)


def alibi_slopes(num_heads: int) -> jax.Array:
  """[N] geometric ALiBi slopes 2^(-8 (h+1) / N)."""
  return jnp.float32(2.0) ** (-8.0 * jnp.arange(1, num_heads + 1, dtype=jnp.float32) / num_heads)


def score_bias(
  q_positions: jax.Array, k_positions: jax.Array, *, scheme: Scheme, num_heads: int
) -> jax.Array | None:
  """Additive score bias [B, N, T, S] (ALiBi), or None."""
  if scheme != Scheme.ALIBI:
    return None
  distance = (q_positions[:, :, None] - k_positions[:, None, :]).astype(jnp.float32)
  return -alibi_slopes(num_heads)[None, :, None, None] * distance[:, None]


def relative_rope_scores(
  q: jax.Array,
  k: jax.Array,
  q_positions: jax.Array,
  k_positions: jax.Array,
  *,
  tab: dict[str, jax.Array],
  query_block: int = 16,
) -> jax.Array:
  """Rotary scores from integer distances: [B, K, G, T, S] in float32.

  Args:
    q: [B, T, K, G, H] un-rotated (scaled) queries.
    k: [B, S, K, H] un-rotated keys.
    q_positions: [B, T]; k_positions: [B, S].
    tab: cos/sin [D, H/2] indexed by distance (float64-computed).
    query_block: queries scored per step (bounds the [T, S, H/2] temporaries).
  """
  batch, num_q, kv_heads, groups, head_dim = q.shape
  pad = -num_q % query_block
  qp = jnp.pad(q.astype(jnp.float32), ((0, 0), (0, pad), (0, 0), (0, 0), (0, 0)))
  pp = jnp.pad(q_positions, ((0, 0), (0, pad)))
  k1, k2 = jnp.split(k.astype(jnp.float32), 2, axis=-1)

  def score_block(args):
    q_blk, p_blk = args  # [B, Tb, K, G, H], [B, Tb]
    q1, q2 = jnp.split(q_blk, 2, axis=-1)
    cos, sin = _lookup(tab, p_blk[:, :, None] - k_positions[:, None, :])  # [B, Tb, S, H/2]
    a = layers.einsum('BTKGi,BSKi,BTSi->BKGTS', q1, k1, cos) + layers.einsum(
      'BTKGi,BSKi,BTSi->BKGTS', q2, k2, cos
    )
    b = layers.einsum('BTKGi,BSKi,BTSi->BKGTS', q1, k2, sin) - layers.einsum(
      'BTKGi,BSKi,BTSi->BKGTS', q2, k1, sin
    )
    return a + b

  blocks_q = qp.reshape(batch, -1, query_block, kv_heads, groups, head_dim).swapaxes(0, 1)
  blocks_p = pp.reshape(batch, -1, query_block).swapaxes(0, 1)
  scores = jax.lax.map(score_block, (blocks_q, blocks_p))  # [nb, B, K, G, Tb, S]
  scores = jnp.moveaxis(scores, 0, 3)  # [B, K, G, nb, Tb, S]
  scores = scores.reshape(batch, kv_heads, groups, -1, k.shape[1])
  return scores[:, :, :, :num_q]
