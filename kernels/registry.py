"""The registry of op implementations: per op, a name and a callable of the op's one signature.

The model computes four numerics-relevant ops, each by the implementation its
config names (`GemmaConfig.impl_of(op)`); docs/kernels.md says how to add one.
Every implementation of an op is called the same way:

  attention  fn(q, k, v, q_positions, k_positions, window, *, precision,
                q_segments=None, k_segments=None, distance_bias=None,
                relative_table=None) -> [B, T, N, H]
             q [B, T, N, H] scaled (and rotated unless `relative_table` is given),
             k, v [B, S, K, H] the whole cache (or ring), positions [B, T] / [B, S]
             (-1: empty slot), window an int or None; the keywords as
             `attention_reference.attention_reference` takes them.
  matmul     fn(x, w, *, precision, w_layout='kn') -> x [..., D] contracted with
             w [D, *out] ('kn') or with a table [V, D] ('nk': the tied unembedding)
  norm       fn(x, w, *, eps) -> x [..., D] / rms(x) * w [D], float32 inside
  rotary     fn(x, positions, *, theta, scale=1.0, fraction=1.0) -> x [B, T, N, H]
             rotated by positions [B, T] / scale (float32 angles, `fraction` of the pairs)

`precision` is a name in `dots.NAMES`. `get(op, name)` is the only way from a
name to an implementation; an unknown name raises `UnknownImplementationError`
naming the registered ones. An implementation's name is part of every config
digest, hence of every model fingerprint: a name must always mean the same
computation.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses

import jax

from graftjax.errors import GraftjaxError
from graftjax.kernels import _common
from graftjax.kernels import attention
from graftjax.kernels import attention_reference
from graftjax.kernels import attention_xla_split
from graftjax.kernels import dots
from graftjax.kernels import matmul_tiles
from graftjax.kernels import rmsnorm
from graftjax.kernels import rotary

OPS = ('attention', 'matmul', 'norm', 'rotary')


class UnknownImplementationError(GraftjaxError, ValueError):
  """An op, or an implementation name of an op, that is not registered."""


class ImplementationDeclarationError(GraftjaxError, ValueError):
  """An implementation whose declaration contradicts itself or a registered one."""


@dataclasses.dataclass(frozen=True)
class Implementation:
  """One implementation of one op.

  Attributes:
    op: one of `OPS`.
    name: the config's `<op>_impl` (or `impl`) value.
    fn: the callable, of the op's signature (module doc).
    chunk_invariant: a row's bits do not depend on how many rows share the call, nor on
      which keys were computed in the same call (fixed tiles, ascending sums, no split-K).
    split_invariant: attention only: sums over slots in splits anchored at absolute slots,
      so a block moved by whole splits keeps its bits (docs/composition.md).
    summary: one line for docs and tables.
  """

  op: str
  name: str
  fn: Callable[..., jax.Array]
  chunk_invariant: bool = False
  split_invariant: bool = False
  summary: str = ''


_REGISTRY: dict[str, dict[str, Implementation]] = {op: {} for op in OPS}


def _check(impl: Implementation) -> None:
  def fail(why: str):
    raise ImplementationDeclarationError(f'{impl.op} implementation {impl.name!r}: {why}')

  if impl.op not in OPS:
    fail(f'unknown op; ops: {OPS}')
  if not isinstance(impl.name, str) or not impl.name.isidentifier():
    fail('the name must be a non-empty identifier')
  if not callable(impl.fn):
    fail(f'fn must be callable, got {impl.fn!r}')
  if impl.split_invariant and impl.op != 'attention':
    fail('only attention sums over slots: split_invariant is an attention declaration')


def register(impl: Implementation) -> Implementation:
  """Adds `impl`; registering an equal declaration again is a no-op.

  Raises:
    ImplementationDeclarationError: if the declaration contradicts itself, or its name is
      taken for its op by another declaration.
  """
  _check(impl)
  known = _REGISTRY[impl.op].get(impl.name)
  if known is not None and known != impl:
    raise ImplementationDeclarationError(
      f'{impl.op} implementation {impl.name!r} is already registered as {known}; pick another name'
    )
  _REGISTRY[impl.op][impl.name] = impl
  return impl


def unregister(op: str, name: str) -> None:
  """Removes a registered implementation (for tests and examples)."""
  get(op, name)
  del _REGISTRY[op][name]


def get(op: str, name: str) -> Implementation:
  """The implementation of `op` registered as `name`.

  Raises:
    UnknownImplementationError: naming `op` and `name`, and every registered name (or op).
  """
  if op not in _REGISTRY:
    raise UnknownImplementationError(f'unknown op {op!r}; ops: {OPS}')
  impl = _REGISTRY[op].get(name) if isinstance(name, str) else None
  if impl is None:
    raise UnknownImplementationError(
      f'unknown {op} implementation {name!r}; registered: {names(op)}'
    )
  return impl


def names(op: str) -> tuple[str, ...]:
  """Every name registered for `op`, in registration order."""
  if op not in _REGISTRY:
    raise UnknownImplementationError(f'unknown op {op!r}; ops: {OPS}')
  return tuple(_REGISTRY[op])


# ------------------------------------------------------------------------------ attention


def attention_xla(
  q, k, v, q_positions, k_positions, window, *, precision: str, **optional
) -> jax.Array:
  """`attention_reference` in the operands' dtype (scores and softmax in float32)."""
  return attention_reference.attention_reference(
    q,
    k,
    v,
    q_positions,
    k_positions,
    window=window,
    precision=dots.from_name(precision),
    compute_dtype=None,
    **optional,
  )


def attention_xla_split_slots(
  q, k, v, q_positions, k_positions, window, *, precision: str, **optional
) -> jax.Array:
  """`attention_xla_split` summed over the Pallas kernel's splits (`attention.default_block_sizes`
  of q's dtype and G = N / K)."""
  group = q.shape[2] // k.shape[2]
  return attention_xla_split.attention_xla_split(
    q,
    k,
    v,
    q_positions,
    k_positions,
    block_s=attention.default_block_sizes(q.dtype, group).block_s,
    window=window,
    precision=dots.from_name(precision),
    **optional,
  )


def attention_pallas(
  q, k, v, q_positions, k_positions, window, *, precision: str, **optional
) -> jax.Array:
  """The chunk-invariant Pallas kernel (`attention.attention`), interpreted off the GPU."""
  return attention.attention(
    q,
    k,
    v,
    q_positions,
    k_positions,
    window=window,
    precision=dots.from_name(precision),
    interpret=_common.interpret_here(),
    **optional,
  )


# ------------------------------------------------------------------------- matmul, norm, rotary


def matmul_xla(x, w, *, precision: str, w_layout: str = 'kn') -> jax.Array:
  """`jnp.einsum` at `precision` (XLA picks its algorithm per shape)."""
  if w_layout == 'nk':
    w = w.T
  letters = 'abcdefgh'[: w.ndim - 1]
  return dots.einsum(f'...D,D{letters}->...{letters}', x, w, dots.from_name(precision))


def norm_pallas(x, w, *, eps: float) -> jax.Array:
  """`rmsnorm.rms_norm`, interpreted off the GPU."""
  return rmsnorm.rms_norm(x, w, eps=eps, interpret=_common.interpret_here())


def rotary_pallas(x, positions, *, theta: float, scale: float = 1.0, fraction: float = 1.0):
  """`rotary.apply_rotary`, interpreted off the GPU."""
  return rotary.apply_rotary(
    x, positions, theta=theta, scale=scale, fraction=fraction, interpret=_common.interpret_here()
  )


BUILTIN = (
  Implementation('attention', 'xla', attention_xla, summary='attention_reference, pure jnp'),
  Implementation(
    'attention',
    'pallas',
    attention_pallas,
    chunk_invariant=True,
    split_invariant=True,
    summary='the Pallas kernel: fixed KV tiles anchored at absolute slots',
  ),
  Implementation(
    'attention',
    'xla_split',
    attention_xla_split_slots,
    split_invariant=True,
    summary="pure jnp, summed over the Pallas kernel's splits",
  ),
  Implementation('matmul', 'xla', matmul_xla, summary='jnp.einsum'),
  Implementation(
    'matmul',
    'pallas',
    matmul_tiles.dense,
    chunk_invariant=True,
    summary='the Pallas matmul (the decode matmul for few rows where shown)',
  ),
  Implementation(
    'norm',
    'xla',
    rmsnorm.rms_norm_reference,
    summary='rms_norm_reference, pure jnp',
  ),
  Implementation(
    'norm', 'pallas', norm_pallas, chunk_invariant=True, summary='the Pallas kernel, row by row'
  ),
  Implementation(
    'rotary',
    'xla',
    rotary.apply_rotary_float32_reference,
    summary='float32 angles in the graph, pure jnp',
  ),
  Implementation(
    'rotary', 'pallas', rotary_pallas, chunk_invariant=True, summary='the Pallas kernel'
  ),
)
for builtin in BUILTIN:
  register(builtin)
