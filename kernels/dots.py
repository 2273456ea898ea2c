"""Dot products at a stated precision.

`precision` is a `lax.Precision` (HIGHEST: IEEE float32 for float32 operands,
exact products and float32 sums for bfloat16 ones) or a bfloat16 split of
float32 operands:

  'bf16x3'  a = a0 + a1 (bfloat16 pieces); a.b ~ a1.b0 + a0.b1 + a0.b0
  'bf16x6'  a = a0 + a1 + a2; adds a2.b0 + a0.b2 + a1.b1 before those three

Each piece product is a bfloat16 dot with float32 accumulation (tensor cores
on a GPU), and the products are summed in the fixed order above, smallest
first, so a split dot is as deterministic and row-invariant as the dot it is
made of. 'bf16x3' keeps about 16 bits of each operand and 'bf16x6' about 24
(docs/kernels.md has the measured error). Operands that are not float32 take
the plain dot at HIGHEST: their pieces past the first would be 0.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax import lax
import jax.numpy as jnp

# Name -> (pieces per operand, the (i, j) products a_i . b_j in summation order).
SPLITS = {
  'bf16x3': (2, ((1, 0), (0, 1), (0, 0))),
  'bf16x6': (3, ((2, 0), (0, 2), (1, 1), (1, 0), (0, 1), (0, 0))),
}
Precision = lax.Precision | str
# Names a flag or config may use: 'highest' or a split.
NAMES = ('highest', *SPLITS)


def check(precision: Precision) -> None:
  """Raises ValueError unless precision is a lax.Precision or a name in SPLITS."""
  if not isinstance(precision, lax.Precision) and precision not in SPLITS:
    raise ValueError(
      f'precision must be a lax.Precision or one of {sorted(SPLITS)}, got {precision!r}'
    )


def from_name(name: str) -> Precision:
  """The precision a name in NAMES stands for."""
  if name not in NAMES:
    raise ValueError(f'precision name must be one of {NAMES}, got {name!r}')
  return lax.Precision.HIGHEST if name == 'highest' else name


def plain(precision: Precision) -> lax.Precision:
  """The lax.Precision of an unsplit product (HIGHEST for a split name)."""
  check(precision)
  return precision if isinstance(precision, lax.Precision) else lax.Precision.HIGHEST


def _splits(precision: Precision, a: jax.Array, b: jax.Array) -> bool:
  check(precision)
  return precision in SPLITS and a.dtype == b.dtype == jnp.float32


def _pieces(x: jax.Array, count: int) -> list[jax.Array]:
  """x (float32) as `count` bfloat16 pieces, largest first: x ~ sum(pieces)."""
  pieces, rest = [], x
  for _ in range(count):
    piece = rest.astype(jnp.bfloat16)
    pieces.append(piece)
    rest = rest - piece.astype(jnp.float32)
  return pieces


def _split_sum(product: Callable, a: jax.Array, b: jax.Array, precision: str) -> jax.Array:
  """The sum, in the split's order, of product(a_i, b_j) over its piece pairs."""
  count, order = SPLITS[precision]
  a_pieces, b_pieces = _pieces(a, count), _pieces(b, count)
  total = None
  for i, j in order:
    term = product(a_pieces[i], b_pieces[j])
    total = term if total is None else total + term
  return total


def dot_general(a: jax.Array, b: jax.Array, dimension_numbers, precision: Precision) -> jax.Array:
  """`lax.dot_general` at `precision` (see the module doc), float32 result."""

  def product(x, y, p=lax.Precision.HIGHEST):
    return lax.dot_general(x, y, dimension_numbers, precision=p, preferred_element_type=jnp.float32)

  if _splits(precision, a, b):
    return _split_sum(product, a, b, precision)
  return product(a, b, plain(precision))


def einsum(spec: str, a: jax.Array, b: jax.Array, precision: Precision) -> jax.Array:
  """`jnp.einsum` of two operands at `precision` (see the module doc), in their dtype."""
  if not _splits(precision, a, b):
    return jnp.einsum(spec, a, b, precision=plain(precision))

  def product(x, y):
    return jnp.einsum(
      spec, x, y, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32
    )

  return _split_sum(product, a, b, precision)
