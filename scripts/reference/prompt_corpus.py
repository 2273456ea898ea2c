"""The fixture prompts: fixed slices of text files that ship with this machine.

Every prompt is a (source file, first line, token budget) triple. Its text is
the longest prefix of the file from that line, cut at a whitespace boundary,
whose tokenization (with BOS) has at most `max_tokens` ids. Nothing is
generated or sampled, so the selection is deterministic given the files and
the tokenizer; the fixtures also store each text and the SHA-256 of its
source file, so they stay meaningful where the files differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
from typing import Callable, Sequence

_LICENSES = pathlib.Path('/usr/share/common-licenses')
_STDLIB = pathlib.Path('/usr/lib/python3.11')
_DOCS = pathlib.Path('/usr/share/doc')


@dataclasses.dataclass(frozen=True)
class PromptSpec:
  name: str
  path: pathlib.Path
  first_line: int  # 1-based.
  max_tokens: int  # including BOS.


# Budgets spread from one text token to ~1,500, with eleven prompts beyond the
# 512-token sliding window of the local layers.
PROMPT_SPECS: tuple[PromptSpec, ...] = (
  PromptSpec('bsd_license_word', _LICENSES / 'BSD', 1, 2),
  PromptSpec('colorsys_doc', _STDLIB / 'colorsys.py', 1, 3),
  PromptSpec('gpl3_title', _LICENSES / 'GPL-3', 1, 5),
  PromptSpec('bisect_doc', _STDLIB / 'bisect.py', 1, 8),
  PromptSpec('cc0_head', _LICENSES / 'CC0-1.0', 1, 13),
  PromptSpec('string_module', _STDLIB / 'string.py', 1, 21),
  PromptSpec('bc_readme', _DOCS / 'bc' / 'README', 1, 34),
  PromptSpec('heapq_doc', _STDLIB / 'heapq.py', 1, 55),
  PromptSpec('apache2_head', _LICENSES / 'Apache-2.0', 1, 89),
  PromptSpec('textwrap_module', _STDLIB / 'textwrap.py', 1, 144),
  PromptSpec('artistic_license', _LICENSES / 'Artistic', 1, 233),
  PromptSpec('shlex_module', _STDLIB / 'shlex.py', 1, 377),
  PromptSpec('mpl2_license', _LICENSES / 'MPL-2.0', 1, 520),
  PromptSpec('fractions_module', _STDLIB / 'fractions.py', 1, 610),
  PromptSpec('gpl2_license', _LICENSES / 'GPL-2', 1, 700),
  PromptSpec('functools_middle', _STDLIB / 'functools.py', 400, 800),
  PromptSpec('lgpl21_license', _LICENSES / 'LGPL-2.1', 1, 900),
  PromptSpec('random_module', _STDLIB / 'random.py', 1, 1000),
  PromptSpec('gfdl13_license', _LICENSES / 'GFDL-1.3', 1, 1100),
  PromptSpec('calendar_module', _STDLIB / 'calendar.py', 1, 1200),
  PromptSpec('gpl3_middle', _LICENSES / 'GPL-3', 100, 1300),
  PromptSpec('statistics_module', _STDLIB / 'statistics.py', 1, 1400),
  PromptSpec('argparse_middle', _STDLIB / 'argparse.py', 1100, 1450),
  PromptSpec('difflib_module', _STDLIB / 'difflib.py', 1, 1500),
)


@dataclasses.dataclass(frozen=True)
class Prompt:
  name: str
  source: str
  source_sha256: str
  first_line: int
  max_tokens: int
  text: str
  token_ids: tuple[int, ...]


def _cut_points(text: str, limit: int) -> list[int]:
  """Prefix lengths ending just before whitespace, within `limit` chars."""
  cuts = [
    i for i in range(1, min(len(text), limit)) if text[i].isspace() and not text[i - 1].isspace()
  ]
  if len(text) <= limit:
    cuts.append(len(text))
  return cuts


def select(spec: PromptSpec, tokenize: Callable[[str], Sequence[int]]) -> Prompt:
  """The longest whitespace-cut prefix of `spec` with <= max_tokens ids."""
  raw = spec.path.read_bytes()
  lines = raw.decode('utf-8').splitlines(keepends=True)
  text = ''.join(lines[spec.first_line - 1 :])
  # A token covers at least one character, so this bounds the search.
  cuts = _cut_points(text, limit=spec.max_tokens * 16)
  lo, hi = 0, len(cuts) - 1  # Binary search for the last fitting cut.
  best = None
  while lo <= hi:
    mid = (lo + hi) // 2
    if len(tokenize(text[: cuts[mid]])) <= spec.max_tokens:
      best, lo = mid, mid + 1
    else:
      hi = mid - 1
  if best is None:
    raise ValueError(f'{spec.name}: not even one word fits in {spec.max_tokens} tokens')
  chosen = text[: cuts[best]]
  return Prompt(
    name=spec.name,
    source=str(spec.path),
    source_sha256=hashlib.sha256(raw).hexdigest(),
    first_line=spec.first_line,
    max_tokens=spec.max_tokens,
    text=chosen,
    token_ids=tuple(int(t) for t in tokenize(chosen)),
  )


def select_all(tokenize: Callable[[str], Sequence[int]]) -> list[Prompt]:
  return [select(spec, tokenize) for spec in PROMPT_SPECS]


def topk_positions(
  length: int, *, dense_up_to: int = 128, stride: int = 4, tail: int = 32
) -> list[int]:
  """Positions whose top-k logits are stored: all of a short prompt, else
  every `stride`-th position plus the last `tail`."""
  if length <= dense_up_to:
    return list(range(length))
  return sorted(set(range(0, length, stride)) | set(range(length - tail, length)))
