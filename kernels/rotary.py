"""NEOX (rotate-half) rotary embedding of queries or keys.

  inv_freq[i] = 1 / theta ** (2 i / H)          i in [0, H / 2), float32
  angle[i]    = float32(position) * inv_freq[i]
  out         = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]

with x1 = x[..., :H/2], x2 = x[..., H/2:], all in float32, cast back to x's
dtype. Partial ('proportional') rotary, as Gemma 4's global layers use it,
rotates only the first `rotated_pairs(H, fraction)` pairs: the other
inverse frequencies are 0, so their angle is 0, cos 1 and sin 0, and those
dims pass through unchanged, bit for bit (x1 * 1 - x2 * 0 = x1). Every element is a fixed function of (x row, position): no reduction,
nothing shared between rows, so a token's rotated key has the same bits
whatever chunk or batch it was computed in. `inv_freq` is a host constant
(`rotary_inv_freq`, computed in float64 and rounded once to float32) so the
kernel, the reference and any caller can share the very same table.

The pure-jnp reference is `apply_rotary_reference`, built from
`rotary_cos_sin` and `rotate_reference` (which the model's `xla` path calls
with its own cos/sin: float32 angles from `rotary_inv_freq_float32`, or a
float64 `rotary_table`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from graftjax.kernels import _common
import numpy as np


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes of the rotary kernel (elementwise; keep fixed all the same).

  Attributes:
    block_t: tokens per program; T is padded to a multiple.
  """

  block_t: int = 1


DEFAULT_BLOCK_SIZES = BlockSizes()


def rotated_pairs(head_dim: int, fraction: float = 1.0) -> int:
  """How many of the H / 2 rotary pairs rotate: int(fraction * H // 2), as transformers'
  'proportional' rope and google-deepmind/gemma count them."""
  if head_dim <= 0 or head_dim % 2:
    raise ValueError(f'head_dim must be positive and even, got {head_dim}')
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f'rotary fraction must be in (0, 1], got {fraction}')
  return int(fraction * head_dim // 2)


def rotary_inv_freq64(head_dim: int, theta: float, fraction: float = 1.0) -> np.ndarray:
  """[H / 2] float64 on the host: 1 / theta ** (2 i / H) for the rotating pairs, else 0."""
  rotated = rotated_pairs(head_dim, fraction)
  exponent = np.arange(0, 2 * rotated, 2, dtype=np.float64) / head_dim
  out = np.zeros(head_dim // 2, np.float64)
  out[:rotated] = 1.0 / np.float64(theta) ** exponent
  return out


def rotary_inv_freq(head_dim: int, theta: float, fraction: float = 1.0) -> np.ndarray:
  """[H / 2] float32: `rotary_inv_freq64` rounded once (the kernel's table)."""
  return rotary_inv_freq64(head_dim, theta, fraction).astype(np.float32)


def _rotate(x1, x2, pos, inv_freq):
  """x1, x2 [..., N, H/2] float32; pos [...] float32; inv_freq [H/2]."""
  angle = pos[..., None] * inv_freq  # [..., H/2]
  cos = jnp.cos(angle)[..., None, :]
  sin = jnp.sin(angle)[..., None, :]
  return x1 * cos - x2 * sin, x2 * cos + x1 * sin


def _rotary_kernel(x_ref, pos_ref, inv_freq_ref, o_ref):
  """x_ref, o_ref [block_t, N, H]; pos_ref [block_t]; inv_freq_ref [H/2]."""
  half = x_ref.shape[-1] // 2
  lo, hi = pl.ds(0, half), pl.ds(half, half)
  x1 = x_ref[:, :, lo].astype(jnp.float32)
  x2 = x_ref[:, :, hi].astype(jnp.float32)
  pos = pos_ref[...].astype(jnp.float32)
  out1, out2 = _rotate(x1, x2, pos, inv_freq_ref[...])
  o_ref[:, :, lo] = out1.astype(o_ref.dtype)
  o_ref[:, :, hi] = out2.astype(o_ref.dtype)


@functools.partial(
  jax.jit, static_argnames=('theta', 'scale', 'fraction', 'block_t', 'num_warps', 'interpret')
)
def apply_rotary(
  x: jax.Array,
  positions: jax.Array,
  *,
  theta: float,
  scale: float = 1.0,
  fraction: float = 1.0,
  block_t: int = DEFAULT_BLOCK_SIZES.block_t,
  num_warps: int = 4,
  interpret: bool = False,
) -> jax.Array:
  """Rotates x by its positions (NEOX rotate-half).

  Args:
    x: [B, T, N, H] queries or keys, H even.
    positions: [B, T] integer positions.
    theta: rotary base (Gemma 3: 10_000 local, 1_000_000 global).
    scale: linear rope scaling: inverse frequencies divided by it (Gemma 3
      global layers from 4B up: 8).
    fraction: of the pairs that rotate (`rotated_pairs`; Gemma 4 global layers: 0.25).
    block_t: tokens per program (T is padded to a multiple).
    num_warps: Triton only.
    interpret: run the kernel in the Pallas interpreter (CPU).

  Returns:
    [B, T, N, H] in x's dtype.
  """
  if x.ndim != 4:
    raise ValueError(f'x must be [B, T, N, H], got {x.shape}')
  batch, num_t, num_heads, head_dim = x.shape
  if positions.shape != (batch, num_t):
    raise ValueError(f'positions {positions.shape} must be [B, T] = {(batch, num_t)}')
  if head_dim % 2:
    raise ValueError(f'head dim H={head_dim} must be even')
  if block_t <= 0:
    raise ValueError(f'{block_t=} must be positive')
  inv_freq = jnp.asarray(rotary_inv_freq(head_dim, theta, fraction) / np.float32(scale))
  padded = pl.cdiv(num_t, block_t) * block_t
  if interpret and batch * padded == block_t:
    padded += block_t  # keep the interpreter's grid a loop (see rmsnorm.py)
  if padded != num_t:
    x = jnp.pad(x, ((0, 0), (0, padded - num_t), (0, 0), (0, 0)))
    positions = jnp.pad(positions, ((0, 0), (0, padded - num_t)))
  out = pl.pallas_call(
    _rotary_kernel,
    grid=(batch, padded // block_t),
    in_specs=[
      pl.BlockSpec((None, block_t, num_heads, head_dim), lambda b, t: (b, t, 0, 0)),
      pl.BlockSpec((None, block_t), lambda b, t: (b, t)),
      pl.BlockSpec((head_dim // 2,), lambda b, t: (0,)),
    ],
    out_specs=pl.BlockSpec((None, block_t, num_heads, head_dim), lambda b, t: (b, t, 0, 0)),
    out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    compiler_params=None if interpret else _common.gpu_compiler_params(num_warps),
    interpret=interpret,
    name='graftjax_rotary',
  )(x, positions.astype(jnp.int32), inv_freq)
  return out[:, :num_t]


def rotary_inv_freq_float32(head_dim: int, theta: float, fraction: float = 1.0) -> jax.Array:
  """[H / 2] float32 computed by XLA in float32, as HF transformers does (0 past the
  rotating pairs)."""
  rotated = rotated_pairs(head_dim, fraction)
  exponents = jnp.arange(0, 2 * rotated, 2, dtype=jnp.float32) / head_dim
  inv_freq = 1.0 / (jnp.float32(theta) ** exponents)
  return jnp.pad(inv_freq, (0, head_dim // 2 - rotated))


def rotary_table(
  head_dim: int, theta: float, index, fraction: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
  """float32 cos, sin [len(index), H / 2] of index * inv_freq, computed in float64."""
  inv_freq = rotary_inv_freq64(head_dim, theta, fraction)
  angles = np.asarray(index, np.float64)[:, None] * inv_freq[None, :]
  return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rotary_cos_sin(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
  """float32 cos, sin [..., H / 2] of angle = float32(position) * inv_freq."""
  angles = positions.astype(jnp.float32)[..., None] * inv_freq
  return jnp.cos(angles), jnp.sin(angles)


def rotate_reference(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """NEOX rotate-half of x [..., N, H] by cos, sin [..., H / 2] in float32, cast back."""
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  cos, sin = cos[..., None, :], sin[..., None, :]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


@functools.partial(jax.jit, static_argnames=('theta',))
def apply_rotary_reference(
  x: jax.Array, positions: jax.Array, *, theta: float, inv_freq: jax.Array | None = None
) -> jax.Array:
  """Pure jnp, the kernel's formula: x [..., N, H] rotated by positions [...].

  `inv_freq` [H / 2] defaults to the kernel's table (`rotary_inv_freq`).
  """
  if inv_freq is None:
    inv_freq = jnp.asarray(rotary_inv_freq(x.shape[-1], theta))
  return rotate_reference(x, *rotary_cos_sin(positions, inv_freq))


def apply_rotary_float32_reference(
  x: jax.Array, positions: jax.Array, *, theta: float, scale: float = 1.0, fraction: float = 1.0
) -> jax.Array:
  """x [..., N, H] rotated by positions [...] divided by `scale`, angles computed by XLA in
  float32 as trained (`rotary_inv_freq_float32`), `fraction` of the pairs rotating."""
  inv_freq = rotary_inv_freq_float32(x.shape[-1], theta, fraction) / jnp.float32(scale)
  return apply_rotary_reference(x, positions, theta=theta, inv_freq=inv_freq)
