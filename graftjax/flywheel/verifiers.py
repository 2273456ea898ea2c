r"""Exact, deterministic verifiers: raw answer text in, a re-checkable verdict out.

Verifiers are open: any module registers one by name and version,

  verifiers.register('exact', 1, lambda text, gold: text.strip() in gold)

and every verdict records both, so `rescore --verifiers=MODULE` can re-run it.
Details: docs/flywheel.md, section `graftjax/flywheel/verifiers.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fractions
import importlib
import re
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from graftjax.errors import GraftjaxError

_DIGITS = r'(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+'
_NUMBER = re.compile(
  r'(?<![\w.])(?P<neg>-)?(?:\$\s?)?'
  rf'(?P<num>{_DIGITS})'
  r'(?:\s*/\s*(?P<den>0*[1-9]\d*)(?![\d.]))?'
)
_HASHES = re.compile(r'####\s*')
_FINAL_ANSWER = re.compile(r'\bfinal answer:\s*', re.IGNORECASE)
_BOXED = re.compile(r'\\boxed\s*\{([^{}]*)\}')
_ANSWER_IS = re.compile(r'\banswer is\s*[:*]*\s*', re.IGNORECASE)
_ARTICLES = re.compile(r'\b(?:a|an|the)\b')


class VerifierError(GraftjaxError, ValueError):
  """A verifier that is unknown, registered twice, or broke its contract."""


@dataclasses.dataclass(frozen=True)
class Verdict:
  """One verification: enough to re-score it from the raw text later.

  Attributes:
    verdict: whether the extracted answer matches the gold.
    extracted: the answer found in the text, normalised; None if none.
    gold: the accepted answers, normalised.
    verifier: the verifier's registered name.
    version: the verifier's version; a change of rules bumps it.
    detail: why the answer failed, when the verifier says (a timeout, an
      exception); recorded only when set.
  """

  verdict: bool
  extracted: str | None
  gold: tuple[str, ...]
  verifier: str
  version: int
  detail: str | None = None

  def to_json(self) -> dict[str, Any]:
    data = dataclasses.asdict(self) | {'gold': list(self.gold)}
    if self.detail is None:
      del data['detail']
    return data

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> Verdict:
    return cls(**(data | {'gold': tuple(data['gold'])}))


@dataclasses.dataclass(frozen=True)
class Check:
  """What a registered check function returns (or a plain bool: `verdict` alone).

  Attributes:
    verdict: whether the answer is right.
    extracted: the answer found in the text, normalised; None if none.
    gold: the accepted answers as compared; None: the gold as given.
    detail: why the answer failed, when there is more to say than "wrong".
  """

  verdict: bool
  extracted: str | None = None
  gold: Sequence[str] | None = None
  detail: str | None = None


def _prepare(text: str) -> str:
  return text.replace('\u2212', '-').replace('$-', '-$')


def _value(match: re.Match[str]) -> fractions.Fraction:
  value = fractions.Fraction(match['num'].replace(',', ''))
  if match['den']:
    value /= int(match['den'])
  return -value if match['neg'] else value


def canonical(value: fractions.Fraction) -> str:
  """`value` as an integer, a terminating decimal, or `p/q`."""
  sign, value = ('-' if value < 0 else ''), abs(value)
  if value.denominator == 1:
    return f'{sign}{value.numerator}'
  rest, twos, fives = value.denominator, 0, 0
  while rest % 2 == 0:
    rest, twos = rest // 2, twos + 1
  while rest % 5 == 0:
    rest, fives = rest // 5, fives + 1
  if rest != 1:
    return f'{sign}{value.numerator}/{value.denominator}'
  places = max(twos, fives)
  whole, frac = divmod((value * 10**places).numerator, 10**places)
  return f'{sign}{whole}.{frac:0{places}d}'


def parse_number(text: str) -> fractions.Fraction:
  """The value of a gold answer that is exactly one number ('2,125', '-3')."""
  stripped = _prepare(text.strip()).rstrip('%').strip()
  match = _NUMBER.fullmatch(stripped)
  if match is None:
    raise ValueError(f'gold answer {text!r} is not a single number')
  return _value(match)


def _after(marker: re.Pattern[str], text: str) -> re.Match[str] | None:
  for found in marker.finditer(text):
    if match := _NUMBER.match(text, found.end()):
      return match
  return None


def _boxed(text: str) -> re.Match[str] | None:
  for box in _BOXED.finditer(text):
    if match := _NUMBER.search(box[1]):
      return match
  return None


def extract_number(text: str) -> fractions.Fraction | None:
  """The final numeric answer in `text` by the module's rules; None if none."""
  text = _prepare(text)
  match = (
    _after(_HASHES, text) or _after(_FINAL_ANSWER, text) or _boxed(text) or _after(_ANSWER_IS, text)
  )
  if match is None:
    numbers = list(_NUMBER.finditer(text))
    match = numbers[-1] if numbers else None
  return None if match is None else _value(match)


def normalize_text(text: str) -> str:
  """QA normal form: NFKC, case-folded, no punctuation, no articles."""
  text = unicodedata.normalize('NFKC', text).casefold()
  text = ''.join(c for c in text if not unicodedata.category(c).startswith('P'))
  words = ' '.join(_ARTICLES.sub(' ', text).split())
  return words or ' '.join(text.split())


class Numeric:
  """Maths answers: the final number, compared as an exact rational."""

  name = 'numeric'
  version = 2

  def check_gold(self, gold: Sequence[str]) -> None:
    """Raises the `ValueError` a call would for `gold` (a part that is not one number)."""
    for g in gold:
      parse_number(g)

  def __call__(self, text: str, gold: Sequence[str]) -> Verdict:
    golds = [parse_number(g) for g in gold]
    value = extract_number(text)
    return Verdict(
      verdict=value is not None and value in golds,
      extracted=None if value is None else canonical(value),
      gold=tuple(canonical(g) for g in golds),
      verifier=self.name,
      version=self.version,
    )


class Alias:
  """Short QA answers: the first line, matched exactly to a gold alias."""

  name = 'alias'
  version = 1

  def check_gold(self, gold: Sequence[str]) -> None:
    """Every gold alias normalises (never raises)."""
    for g in gold:
      normalize_text(g)

  def __call__(self, text: str, gold: Sequence[str]) -> Verdict:
    golds = tuple(normalize_text(g) for g in gold)
    lines = [line for line in text.splitlines() if line.strip()]
    extracted = normalize_text(lines[0]) if lines else None
    return Verdict(
      verdict=bool(extracted) and extracted in golds,
      extracted=extracted,
      gold=golds,
      verifier=self.name,
      version=self.version,
    )


class Verifier(Protocol):
  """`verifier(text, gold) -> Verdict`, with the `name` and `version` it records. It may
  have `check_gold(gold)`, raising the `ValueError` a call would on `gold`, without the cost
  of a call (`loop.check_task` checks every item's gold with it)."""

  name: str
  version: int

  def __call__(self, text: str, gold: Sequence[str]) -> Verdict: ...


CheckFn = Callable[[str, Sequence[str]], 'Check | bool']


class Registered:
  """A verifier made by `register` from a check function (and its gold check, if given)."""

  def __init__(
    self, name: str, version: int, fn: CheckFn, gold: Callable[[Sequence[str]], Any] | None = None
  ):
    self.name, self.version, self.fn = name, version, fn
    if gold is not None:
      self.check_gold = lambda g: gold(tuple(g))

  def __call__(self, text: str, gold: Sequence[str]) -> Verdict:
    found = self.fn(text, tuple(gold))
    if isinstance(found, bool):
      found = Check(found)
    if not isinstance(found, Check):
      raise VerifierError(
        f'verifier {self.name!r} v{self.version} returned {type(found).__name__},'
        ' not a Check or a bool'
      )
    return Verdict(
      verdict=bool(found.verdict),
      extracted=found.extracted,
      gold=tuple(gold if found.gold is None else found.gold),
      verifier=self.name,
      version=self.version,
      detail=found.detail,
    )


_REGISTRY: dict[tuple[str, int], Verifier] = {}


def _definition(verifier: Verifier) -> Any:
  return verifier.fn if isinstance(verifier, Registered) else type(verifier)


def _origin(verifier: Verifier) -> tuple[str | None, str | None]:
  fn = _definition(verifier)
  return getattr(fn, '__module__', None), getattr(fn, '__qualname__', None)


def _same(a: Verifier, b: Verifier) -> bool:
  """Whether two verifiers are one definition (the same one, or a re-import of it)."""
  if _definition(a) is _definition(b):
    return True
  where = _origin(a)
  return where == _origin(b) and None not in where and '<lambda>' not in where[1]


def add(verifier: Verifier) -> Verifier:
  """Registers a verifier object under its own `name` and `version`; returns it.

  Registering one definition again (the same object, or the same function after
  a module is imported again) replaces it; another definition under a taken name
  and version is a `VerifierError`: bump the version when the rules change.
  """
  name, version = getattr(verifier, 'name', None), getattr(verifier, 'version', None)
  if not isinstance(name, str) or not name or type(version) is not int or version < 1:
    raise VerifierError(
      f'a verifier needs a non-empty name and an integer version >= 1, got {name!r} {version!r}'
    )
  held = _REGISTRY.get((name, version))
  if held is not None and not _same(held, verifier):
    raise VerifierError(
      f'verifier {name!r} version {version} is already registered by another definition'
      f' ({".".join(map(str, _origin(held)))}); bump the version for new rules'
    )
  _REGISTRY[(name, version)] = verifier
  return verifier


def register(
  name: str, version: int, fn: CheckFn, *, gold: Callable[[Sequence[str]], Any] | None = None
) -> Verifier:
  """Registers `fn(text, gold) -> Check | bool` as verifier `name` at `version`.

  Args:
    name: the name verdicts record ('exact', 'code').
    version: a positive integer; bump it whenever the rules change, so old
      verdicts are re-checked by the rules that wrote them.
    fn: the check: the raw answer text and the accepted gold answers in, a
      `Check` (or just a bool) out. It must be deterministic.
    gold: optional: `gold(gold)` raises the `ValueError` `fn` would on that gold, cheaply
      (without running anything); then a task's items are checked with it up front, else
      `fn` runs on each item's reference.

  Returns:
    The verifier: `verifier(text, gold) -> Verdict`.
  """
  if not callable(fn):
    raise VerifierError(f'verifier {name!r}: {fn!r} is not callable')
  return add(Registered(name, version, fn, gold))


_RETIRED: dict[tuple[str, int], tuple[int, str]] = {}


def retire(name: str, version: int, *, successor: int, reason: str) -> None:
  """Marks `name` at `version` as retired: its rules are no longer run (they accepted what
  they should not have), and a verdict it wrote is re-checked by `successor`'s rules, on
  its pass or fail alone (the other fields are the retired rules' own)."""
  if successor <= version:
    raise VerifierError(f'verifier {name!r}: successor {successor} of v{version} is not newer')
  _RETIRED[(name, version)] = (successor, reason)


def retired(name: str, version: int) -> tuple[int, str] | None:
  """(successor version, reason) if `name` at `version` is retired, else None."""
  return _RETIRED.get((name, version))


def registered() -> list[tuple[str, int]]:
  """Every registered (name, version), sorted."""
  return sorted(_REGISTRY)


# Verifiers of the library registered by importing their module, on first use.
_MODULES = {'code': 'graftjax.flywheel.code_verifier'}


def get(name: str, version: int | None = None) -> Verifier:
  """The verifier `name` at `version` (None: its newest); a `VerifierError` if unregistered.
  A verifier of the library ('code') is registered here if its module is not yet imported."""
  if name in _MODULES and not any(n == name for n, _ in _REGISTRY):
    importlib.import_module(_MODULES[name])
  versions = sorted(v for n, v in _REGISTRY if n == name)
  if not versions:
    known = sorted({n for n, _ in _REGISTRY})
    raise VerifierError(
      f'unknown verifier {name!r}; registered: {known} (a module that registers it must be'
      ' imported first, e.g. rescore --verifiers=MODULE)'
    )
  if version is None:
    version = versions[-1]
  if version not in versions:
    raise VerifierError(
      f'verifier {name!r} is registered at versions {versions}, the record was written by'
      f' version {version}'
    )
  return _REGISTRY[(name, version)]


@contextlib.contextmanager
def plugin_failures(
  what: str, error: type[Exception], *, contract: tuple[type[Exception], ...] = ()
) -> Iterator[None]:
  """Runs a user's plug-in code (a module a command line names, or what it defines): any
  exception it raises (but those of its `contract`, raised as they are), or its `sys.exit`,
  comes out as `error` whose message is `what`, then the cause; the caller goes on
  deciding (a plug-in never ends the process).

  Example: `with plugin_failures(f'--verifiers: cannot import {name!r}', RescoreError):`.
  """
  try:
    yield
  except contract:
    raise
  except SystemExit as e:
    raise error(f'{what}: it called sys.exit({e.code!r})') from e
  except Exception as e:  # any failure of the user's code, named with its cause
    raise error(f'{what}: {type(e).__name__}: {e}') from e


NUMERIC = add(Numeric())
ALIAS = add(Alias())
VERIFIERS: dict[str, Verifier] = {v.name: v for v in (NUMERIC, ALIAS)}  # the built-in ones
