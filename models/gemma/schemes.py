"""The registry of position schemes: what each one declares.

A scheme is a name and four facts (docs/positions.md):

* `keys`: what the cache stores. `ABSOLUTE`: keys rotated by their absolute
  position (rotary, `angles` says how cos/sin are computed). `RELATIVE`:
  un-rotated keys; q . k is rotary from the integer distance (a float64
  cos/sin table indexed by q_pos - k_pos). `PLAIN`: keys as projected.
* `relocation_exact`: whether a block moved to another offset and grafted
  gives the bits of a fresh computation there. True exactly when the cached
  keys carry no absolute position (`RELATIVE`, `PLAIN`).
* `bias`: an optional score bias as a function of the query-key distance,
  `bias(distance [D] int64, num_heads) -> [N, D] float32`, evaluated once on
  the host; attention adds bias[n, q_pos - k_pos] to every visible score.

`get(name)` is the only way from a name to a scheme; an unknown name raises
`UnknownSchemeError` naming the registered ones. A scheme's name is part of
every config digest, so a name must always mean the same computation.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import enum

import jax.numpy as jnp
import numpy as np

from graftjax.errors import GraftjaxError

Bias = Callable[[np.ndarray, int], np.ndarray]  # (distance [D], N) -> [N, D] float32


class UnknownSchemeError(GraftjaxError, ValueError):
  """A position scheme name that is not registered."""


class SchemeDeclarationError(GraftjaxError, ValueError):
  """A scheme whose declaration contradicts itself or a registered one."""


class Keys(enum.Enum):
  """What the cache stores for a key."""

  ABSOLUTE = 'absolute'  # rotated by its absolute position
  RELATIVE = 'relative'  # un-rotated; the score is rotary from the distance
  PLAIN = 'plain'  # as projected; no rotation anywhere


ANGLES = ('float32', 'float64')  # how an ABSOLUTE scheme's cos/sin are computed


@dataclasses.dataclass(frozen=True)
class Scheme:
  """One position scheme.

  Attributes:
    name: the config's `position_scheme` value.
    keys: what the cache stores (`Keys`).
    relocation_exact: a block grafted at another offset equals fresh there,
      byte for byte (True iff keys are not `ABSOLUTE`).
    angles: for `ABSOLUTE` keys, 'float32' (angles computed in the graph, as
      trained) or 'float64' (a host table indexed by position); else None.
    bias: score bias of the distance (`Bias`), or None.
    summary: one line for docs and tables.
  """

  name: str
  keys: Keys
  relocation_exact: bool
  angles: str | None = None
  bias: Bias | None = None
  summary: str = ''

  @property
  def uses_tables(self) -> bool:
    """Whether the model needs host tables (`positions.tables`) for this scheme."""
    return self.angles == 'float64' or self.keys == Keys.RELATIVE or self.bias is not None


_REGISTRY: dict[str, Scheme] = {}


def _check(scheme: Scheme) -> None:
  def fail(why: str):
    raise SchemeDeclarationError(f'position scheme {scheme.name!r}: {why}')

  if not isinstance(scheme.name, str) or not scheme.name.isidentifier():
    fail('the name must be a non-empty identifier')
  if not isinstance(scheme.keys, Keys):
    fail(f'keys must be a Keys member, got {scheme.keys!r}')
  if (scheme.keys == Keys.ABSOLUTE) != (scheme.angles is not None):
    fail(f'angles ({ANGLES}) are declared exactly for ABSOLUTE keys, got {scheme.angles!r}')
  if scheme.angles is not None and scheme.angles not in ANGLES:
    fail(f'angles must be one of {ANGLES}, got {scheme.angles!r}')
  exact = scheme.keys != Keys.ABSOLUTE
  if scheme.relocation_exact != exact:
    fail(
      f'relocation_exact={scheme.relocation_exact} contradicts keys={scheme.keys.value}:'
      ' moved keys give fresh bits exactly when they carry no absolute position'
    )


def register(scheme: Scheme) -> Scheme:
  """Adds `scheme`; registering an equal declaration again is a no-op.

  Raises:
    SchemeDeclarationError: if the declaration contradicts itself, or the
      name is taken by another declaration.
  """
  _check(scheme)
  known = _REGISTRY.get(scheme.name)
  if known is not None and known != scheme:
    raise SchemeDeclarationError(
      f'position scheme {scheme.name!r} is already registered as {known}; pick another name'
    )
  _REGISTRY[scheme.name] = scheme
  return scheme


def unregister(name: str) -> None:
  """Removes a registered scheme (for tests and examples)."""
  get(name)
  del _REGISTRY[name]


def get(name: str | Scheme) -> Scheme:
  """The registered scheme of `name` (a Scheme: itself, if it is the one registered).

  Raises:
    UnknownSchemeError: naming `name` and every registered scheme.
  """
  key = name.name if isinstance(name, Scheme) else name
  scheme = _REGISTRY.get(key) if isinstance(key, str) else None
  if scheme is None or (isinstance(name, Scheme) and name != scheme):
    raise UnknownSchemeError(f'unknown position scheme {name!r}; registered: {names()}')
  return scheme


def names() -> tuple[str, ...]:
  """Every registered name, in registration order."""
  return tuple(_REGISTRY)


def registered() -> tuple[Scheme, ...]:
  return tuple(_REGISTRY.values())


def alibi_slopes(num_heads: int) -> jnp.ndarray:
  """[N] geometric ALiBi slopes 2^(-8 (h+1) / N), float32."""
  return jnp.float32(2.0) ** (-8.0 * jnp.arange(1, num_heads + 1, dtype=jnp.float32) / num_heads)


def alibi_bias(distance: np.ndarray, num_heads: int) -> np.ndarray:
  """[N, D] float32: -slope[n] * float32(d), rounded once as the product of two float32s."""
  slopes = np.asarray(alibi_slopes(num_heads), np.float32)
  return -slopes[:, None] * np.asarray(distance, np.float32)[None, :]


ROPE = register(
  Scheme(
    'rope',
    Keys.ABSOLUTE,
    relocation_exact=False,
    angles='float32',
    summary='as trained: q and k rotated by absolute position, float32 angles',
  )
)
ROPE_F64 = register(
  Scheme(
    'rope_f64',
    Keys.ABSOLUTE,
    relocation_exact=False,
    angles='float64',
    summary='the same rotation, cos/sin from a float64 table indexed by position',
  )
)
ROPE_RELATIVE = register(
  Scheme(
    'rope_relative',
    Keys.RELATIVE,
    relocation_exact=True,
    summary='un-rotated keys; rotary scores from a float64 table indexed by distance',
  )
)
ALIBI = register(
  Scheme(
    'alibi',
    Keys.PLAIN,
    relocation_exact=True,
    bias=alibi_bias,
    summary='no rotation; a linear distance bias -slope_h * d per head',
  )
)
NOPE = register(
  Scheme('nope', Keys.PLAIN, relocation_exact=True, summary='no position signal (causal mask only)')
)
