r"""Exact, deterministic verifiers: raw answer text in, a re-checkable verdict out.

Details: docs/flywheel.md, section `graftjax/flywheel/verifiers.py`.
"""

from __future__ import annotations

import dataclasses
import fractions
import re
from typing import Any, Sequence
import unicodedata

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


@dataclasses.dataclass(frozen=True)
class Verdict:
  """One verification: enough to re-score it from the raw text later.

  Attributes:
    verdict: whether the extracted answer matches the gold.
    extracted: the answer found in the text, normalised; None if none.
    gold: the accepted answers, normalised.
    verifier: the verifier's name (a key of `VERIFIERS`).
    version: the verifier's version; a change of rules bumps it.
  """

  verdict: bool
  extracted: str | None
  gold: tuple[str, ...]
  verifier: str
  version: int

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self) | {'gold': list(self.gold)}

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> Verdict:
    return cls(**(data | {'gold': tuple(data['gold'])}))


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


Verifier = Numeric | Alias
VERIFIERS: dict[str, Verifier] = {v.name: v for v in (Numeric(), Alias())}


def get(name: str, version: int) -> Verifier:
  """The verifier that wrote a verdict; refuses another version of its rules."""
  if name not in VERIFIERS:
    raise ValueError(f'unknown verifier {name!r}; known: {sorted(VERIFIERS)}')
  verifier = VERIFIERS[name]
  if verifier.version != version:
    raise ValueError(
      f'verifier {name!r} is version {verifier.version}, the record was '
      f'written by version {version}'
    )
  return verifier
