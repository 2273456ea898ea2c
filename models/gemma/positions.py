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
forward pass as arguments, so they are computed once per size. The rotary
formulas and the relative scores are `graftjax.kernels`' references
(`rotary`, `attention_reference`); this module picks them per scheme.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from graftjax.kernels import rotary
from graftjax.models.gemma import config as config_lib

Scheme = config_lib.PositionScheme


@functools.lru_cache(maxsize=16)
def _float64_table(head_dim: int, theta: float, size: int) -> tuple[np.ndarray, np.ndarray]:
  return rotary.rotary_table(head_dim, theta, np.arange(size))


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
  scale: float = 1.0,
) -> jax.Array:
  """Applies the scheme's rotation to queries or keys [B, T, N, H] at positions [B, T].

  Identity for schemes that do not rotate (`rope_relative` caches raw keys).
  `scale` is linear rope scaling (`rope` only): inverse frequencies divided by it.
  """
  if scheme == Scheme.ROPE:
    inv_freq = rotary.rotary_inv_freq_float32(x.shape[-1], theta) / jnp.float32(scale)
    return rotary.apply_rotary_reference(x, positions, theta=theta, inv_freq=inv_freq)
  if scheme == Scheme.ROPE_F64:
    return rotary.rotate_reference(x, *_lookup(tabs[theta_key(theta)], positions))
  return x


def relocate_keys(
  k: jax.Array, delta: int, *, scheme: Scheme, theta: float, scale: float = 1.0
) -> jax.Array:
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
    delta_position = jnp.full((1, 1), delta, jnp.int32)
    cos, sin = rotary.rotary_cos_sin(
      delta_position, rotary.rotary_inv_freq_float32(head_dim, theta) / jnp.float32(scale)
    )
  else:
    cos, sin = (jnp.asarray(t)[None] for t in rotary.rotary_table(head_dim, theta, [delta]))
  flat = k.reshape((1, -1) + k.shape[-2:])  # every cached row shifts by the same delta
  return rotary.rotate_reference(flat, cos, sin).reshape(k.shape)


def alibi_slopes(num_heads: int) -> jax.Array:
  """[N] geometric ALiBi slopes 2^(-8 (h+1) / N)."""
  return jnp.float32(2.0) ** (-8.0 * jnp.arange(1, num_heads + 1, dtype=jnp.float32) / num_heads)
