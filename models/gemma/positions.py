"""How a token's position enters attention, per registered scheme (`schemes`).

* Rotation before the cache (`rotate_for_cache`): `ABSOLUTE` schemes rotate
  queries and keys by their absolute positions (NEOX rotate-half), with
  float32 angles computed in the graph (`rope`) or cos/sin read from a
  float64 host table indexed by position (`rope_f64`). `RELATIVE` and
  `PLAIN` schemes cache keys as projected.
* Scores (in `attention`): `RELATIVE` schemes score un-rotated q and k from
  the integer distance d = i - j alone,
      q_rot(i) . k_rot(j) = sum_pairs a cos(d theta) + b sin(d theta),
      a = q1 k1 + q2 k2,  b = q1 k2 - q2 k1,
  with cos/sin read from a float64 table indexed by d. A scheme's `bias`
  adds a host-built [N, D] table, indexed by (head, d), to the scores.
* Relocation (`relocate_keys`): `ABSOLUTE` keys are re-rotated (approximate);
  other keys carry no absolute position and are returned as they are.
* Partial rotary (Gemma 4's global layers): only the first pairs rotate
  (`rotary.rotated_pairs`); every formula above runs unchanged with inverse
  frequency 0 on the other pairs (angle 0: cos 1, sin 0, in every table), so
  those pairs enter scores as a plain dot product under every scheme.

Tables are built on the host (numpy, float64 where angles are involved) and
passed to the jitted forward pass as arguments, so they are computed once
per size. The rotary formulas and the relative scores are
`graftjax.kernels`' (`rotary`, `attention_reference`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from graftjax.kernels import rotary
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import schemes

BIAS = 'bias'  # the key of the distance-bias table in `tables`


@functools.lru_cache(maxsize=16)
def _float64_table(
  head_dim: int, theta: float, size: int, fraction: float
) -> tuple[np.ndarray, np.ndarray]:
  return rotary.rotary_table(head_dim, theta, np.arange(size), fraction)


def table(head_dim: int, theta: float, size: int, fraction: float = 1.0) -> dict[str, jax.Array]:
  """cos/sin [size, H/2] of index * inverse frequency, computed in float64."""
  cos, sin = _float64_table(head_dim, float(theta), int(size), float(fraction))
  return {'cos': jnp.asarray(cos), 'sin': jnp.asarray(sin)}


def bias_table(scheme: schemes.Scheme, num_heads: int, size: int) -> jax.Array:
  """[N, size] float32: the scheme's bias at distances 0..size-1.

  Raises:
    SchemeDeclarationError: if the bias function returns another shape or a
      non-finite value.
  """
  out = np.asarray(scheme.bias(np.arange(size), num_heads))
  if out.shape != (num_heads, size) or out.dtype != np.float32:
    raise schemes.SchemeDeclarationError(
      f'position scheme {scheme.name!r}: bias gave {out.dtype}{list(out.shape)},'
      f' expected float32{[num_heads, size]}'
    )
  if not np.isfinite(out).all():
    raise schemes.SchemeDeclarationError(f'position scheme {scheme.name!r}: bias is not finite')
  return jnp.asarray(out)


def tables(config: config_lib.GemmaConfig, size: int) -> dict[str, Any] | None:
  """Host-computed tables the config's scheme needs; None if none.

  Keys: `rope_key(config, layer)` -> cos/sin tables (`table`, one per
  distinct rotary of a layer) for `rope_f64`-like and `RELATIVE` schemes; `BIAS` -> the [N, size] distance bias. For a
  position table the index is an absolute position, so `size` must exceed
  every position used; for a distance table it must exceed every distance
  between a query and a visible key.
  """
  scheme = schemes.get(config.position_scheme)
  if not scheme.uses_tables:
    return None
  out: dict[str, Any] = {}
  if scheme.angles == 'float64' or scheme.keys == schemes.Keys.RELATIVE:
    for layer in range(config.num_layers):
      key = rope_key(config, layer)
      if key not in out:
        out[key] = table(
          config.head_dim_of(layer), config.rope_theta(layer), size, config.rotary_fraction(layer)
        )
  if scheme.bias is not None:
    out[BIAS] = bias_table(scheme, config.num_heads, size)
  return out


def theta_key(theta: float, head_dim: int | None = None, fraction: float = 1.0) -> str:
  """The tables' key of a rotary: its theta, and its head width and fraction where the
  layer's differ from a full rotary of the config's `head_dim` (None)."""
  key = f'theta_{theta:g}'
  if head_dim is not None or fraction != 1.0:
    key += f'_h{head_dim}_f{fraction:g}'
  return key


def rope_key(config: config_lib.GemmaConfig, layer: int) -> str:
  """`theta_key` of `layer`'s rotary."""
  head_dim, fraction = config.head_dim_of(layer), config.rotary_fraction(layer)
  if head_dim == config.head_dim and fraction == 1.0:
    return theta_key(config.rope_theta(layer))
  return theta_key(config.rope_theta(layer), head_dim, fraction)


def table_rows(tabs) -> int | None:
  """Rows (positions or distances covered) of `tables`' output; None for no tables."""
  if tabs is None:
    return None
  if BIAS in tabs:
    return tabs[BIAS].shape[1]
  return next(iter(tabs.values()))['cos'].shape[0]


def _lookup(tab: dict[str, jax.Array], index: jax.Array) -> tuple[jax.Array, jax.Array]:
  size = tab['cos'].shape[0]
  index = jnp.clip(index, 0, size - 1)
  return jnp.take(tab['cos'], index, axis=0), jnp.take(tab['sin'], index, axis=0)


def check_table_size(tabs, needed: int) -> None:
  """Raises ValueError if a position/distance table is too small (host side)."""
  size = table_rows(tabs)
  if size is not None and needed >= size:
    raise ValueError(f'position table of {size} rows cannot index {needed}; build it larger')


def rotate_for_cache(
  x: jax.Array,
  positions: jax.Array,
  *,
  scheme: str | schemes.Scheme,
  theta: float,
  tabs=None,
  scale: float = 1.0,
  fraction: float = 1.0,
  key: str | None = None,
) -> jax.Array:
  """Applies the scheme's rotation to queries or keys [B, T, N, H] at positions [B, T].

  Identity for schemes whose keys are not `ABSOLUTE`. `scale` is linear rope scaling
  (float32 angles only): inverse frequencies divided by it; `fraction` of the pairs
  rotate (`rotary.rotated_pairs`). `key` names the table in `tabs` (default
  `theta_key(theta)`).

  Raises:
    UnknownSchemeError: if `scheme` is not registered.
  """
  scheme = schemes.get(scheme)
  if scheme.angles == 'float32':
    return rotary.apply_rotary_float32_reference(
      x, positions, theta=theta, scale=scale, fraction=fraction
    )
  if scheme.angles == 'float64':
    return rotary.rotate_reference(x, *_lookup(tabs[key or theta_key(theta)], positions))
  return x


def relocate_keys(
  k: jax.Array,
  delta: int,
  *,
  scheme: str | schemes.Scheme,
  theta: float,
  scale: float = 1.0,
  fraction: float = 1.0,
) -> jax.Array:
  """Re-rotates cached keys [..., n, K, H] by `delta` positions (K-shift).

  For `ABSOLUTE` keys, R(p + delta) k is approximated by R(delta) R(p) k, as
  llama.cpp's K-shift and CacheBlend do; the result is not bit-equal to a
  fresh rotation. Other keys carry no absolute position: returned as they are.

  Raises:
    UnknownSchemeError: if `scheme` is not registered.
  """
  scheme = schemes.get(scheme)
  if scheme.keys != schemes.Keys.ABSOLUTE:
    return k
  head_dim = k.shape[-1]
  if scheme.angles == 'float32':
    delta_position = jnp.full((1, 1), delta, jnp.int32)
    cos, sin = rotary.rotary_cos_sin(
      delta_position,
      rotary.rotary_inv_freq_float32(head_dim, theta, fraction) / jnp.float32(scale),
    )
  else:
    cos, sin = (
      jnp.asarray(t)[None] for t in rotary.rotary_table(head_dim, theta, [delta], fraction)
    )
  flat = k.reshape((1, -1) + k.shape[-2:])  # every cached row shifts by the same delta
  return rotary.rotate_reference(flat, cos, sin).reshape(k.shape)
