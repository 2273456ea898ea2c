"""The library: verified solutions deposited as KV blocks, with a catalog.

A deposit prefills a fixed template (question, worked solution, final
answer) at slot 0 of a cache of the library's shape, captures it as a block
and puts it in a `BlockStore`; a row in an sqlite catalog (`catalog.db`
beside the blocks) records what the block holds and how it was verified.
Only a solution whose verification record re-verifies is deposited.
Deposits are content-addressed and idempotent: depositing the same item
again is a no-op, so an interrupted run resumes from the catalog.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import sqlite3
from typing import Any

from graftjax import blocks
from graftjax import store as store_lib

# A recurring question is asked as RECALL_QUERY after its block: the query
# repeats the block's first line and a half, so the answer is a copy a few
# tokens away (with the solution first, a 270M model re-derives it instead).
TEMPLATE = 'Question: {question}\nFinal answer: {answer}\nSolution: {solution}\n\n'
# A short answer (QA) has no solution to show: its block is the answer alone.
ANSWER_TEMPLATE = 'Question: {question}\nFinal answer: {answer}\n\n'
FORMS = ('solution', 'answer')
RECALL_QUERY = 'Question: {question}\nFinal answer:'
SOLVE_QUERY = 'Question: {question}\nSolution:'
# Where a solution's own closing answer line starts (ours, or GSM8K's '####').
_ANSWER_LINE = re.compile(r'\n\s*(?:Final answer:|####)')

_SCHEMA = """
CREATE TABLE IF NOT EXISTS deposits (
  key TEXT NOT NULL,
  task TEXT NOT NULL,
  item_id TEXT NOT NULL,
  question TEXT NOT NULL,
  text TEXT NOT NULL,
  answer TEXT NOT NULL,
  source TEXT NOT NULL CHECK (source IN ('self', 'reference')),
  verdict TEXT NOT NULL,
  tokens_spent INTEGER NOT NULL,
  block_tokens INTEGER NOT NULL,
  PRIMARY KEY (task, item_id)
)
"""


class DepositError(ValueError):
  """A solution cannot be deposited: it does not re-verify, or the item is inconsistent."""


@dataclasses.dataclass(frozen=True)
class Shape:
  """The cache every block of a library is computed in (and grafted into).

  Attributes:
    capacity: cache slots (block + query + answer must fit).
    chunk_size: prefill chunk of the block's template.
  """

  capacity: int = 1024
  chunk_size: int = 64


@dataclasses.dataclass(frozen=True)
class Entry:
  """One catalog row: a deposited block and what it holds."""

  key: str
  task: str
  item_id: str
  question: str
  text: str
  answer: str
  source: str
  verdict: dict[str, Any]
  tokens_spent: int
  block_tokens: int


class Library:
  """Blocks in a `BlockStore` under `root`, their catalog in `root/catalog.db`."""

  def __init__(self, root: str | os.PathLike[str], *, shape: Shape = Shape()):
    self.root = pathlib.Path(root)
    self.shape = shape
    self.store = store_lib.BlockStore(self.root / 'blocks')
    self._db = sqlite3.connect(self.root / 'catalog.db')
    with self._db:
      self._db.execute(_SCHEMA)

  def close(self) -> None:
    self._db.close()

  def entries(self) -> list[Entry]:
    rows = self._db.execute('SELECT * FROM deposits ORDER BY task, item_id').fetchall()
    return [_entry(row) for row in rows]

  def find(self, task: str, item_id: str) -> Entry | None:
    row = self._db.execute(
      'SELECT * FROM deposits WHERE task = ? AND item_id = ?', (task, item_id)
    ).fetchone()
    return _entry(row) if row else None

  def deposit(
    self,
    model,
    *,
    item,
    verifier,
    solution: str,
    source: str,
    tokens_spent: int,
    record: dict[str, Any] | None = None,
    form: str = 'solution',
  ) -> Entry:
    """Verifies `solution` for `item`, then deposits it as a block (once).

    Args:
      model: the frozen `Gemma` the block is computed with.
      item: a `tasks.Item` (`task`, `id`, `question`, `gold`).
      verifier: `verifier(text, gold) -> verifiers.Verdict` (the task's verifier).
      solution: the worked solution as produced (the model's text, or the
        dataset's); it must verify. Its own closing answer line ('Final
        answer: ...' or '#### ...') gives way to the template's.
      source: 'self' (the model solved it) or 'reference' (the dataset's own).
      tokens_spent: decode tokens the solve step spent on this item.
      record: the verdict recorded when the solution was checked before
        (`verdict.to_json()`); the deposit is refused unless it re-verifies
        to the same record.
      form: 'solution' (TEMPLATE: the worked solution under the verifier's
        canonical answer) or 'answer' (ANSWER_TEMPLATE: the solution's first
        line, a short answer such as 'Spain', which must verify on its own).
    Returns:
      The catalog entry (the existing one if the item was deposited before).
    Raises:
      DepositError: the solution does not verify (or not to `record`), or
        the source or form is unknown.
    """
    if source not in ('self', 'reference'):
      raise DepositError(f"source must be 'self' or 'reference', got {source!r}")
    if form not in FORMS:
      raise DepositError(f'form must be one of {FORMS}, got {form!r}')
    existing = self.find(item.task, item.id)
    if existing is not None:
      return existing
    verdict = verifier(solution, item.gold)
    if not verdict.verdict:
      raise DepositError(
        f'{item.task}/{item.id}: the solution does not verify (extracted'
        f' {verdict.extracted!r}, gold {item.gold!r}); nothing deposited'
      )
    if record is not None and record != verdict.to_json():
      raise DepositError(
        f'{item.task}/{item.id}: the recorded verdict {record} does not re-verify'
        f' ({verdict.to_json()}); nothing deposited'
      )
    if form == 'answer':
      text = ANSWER_TEMPLATE.format(
        question=item.question, answer=_answer_line(item, verifier, solution)
      )
    else:
      body = _ANSWER_LINE.split(solution.strip(), maxsplit=1)[0].strip()
      text = TEMPLATE.format(question=item.question, solution=body, answer=verdict.extracted)
    ids = model.tokenizer.encode(text)
    if len(ids) > self.shape.capacity:
      raise DepositError(f'{len(ids)} tokens do not fit the library capacity {self.shape.capacity}')
    cache = model.init_cache(capacity=self.shape.capacity)
    _, cache = model.prefill(ids, cache=cache, chunk_size=self.shape.chunk_size, logits='none')
    block = blocks.capture(
      cache, blocks.Span(0, len(ids)), token_ids=ids, target=model.graft_target
    )
    key = self.store.put(block)
    entry = Entry(
      key=key,
      task=item.task,
      item_id=item.id,
      question=item.question,
      text=text,
      answer=str(verdict.extracted),
      source=source,
      verdict=verdict.to_json(),
      tokens_spent=int(tokens_spent),
      block_tokens=len(ids),
    )
    try:
      with self._db:
        self._db.execute(
          'INSERT INTO deposits VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
          (
            entry.key,
            entry.task,
            entry.item_id,
            entry.question,
            entry.text,
            entry.answer,
            entry.source,
            json.dumps(entry.verdict, sort_keys=True),
            entry.tokens_spent,
            entry.block_tokens,
          ),
        )
    except sqlite3.IntegrityError:  # another process deposited this item meanwhile
      return self.find(item.task, item.id)
    return entry


def _answer_line(item, verifier, solution: str) -> str:
  """The solution's first non-empty line, which must verify alone."""
  line = next((line.strip() for line in solution.splitlines() if line.strip()), '')
  if not verifier(line, item.gold).verdict:
    raise DepositError(
      f'{item.task}/{item.id}: the answer line {line!r} does not verify alone; nothing deposited'
    )
  return line


def _entry(row) -> Entry:
  fields = [f.name for f in dataclasses.fields(Entry)]
  data = dict(zip(fields, row))
  data['verdict'] = json.loads(data['verdict'])
  return Entry(**data)
