"""The task interface: items with a gold answer, how they are asked, and who checks them.

Any dataset plugs in as a `Task`: a name, a verifier (a registered name, see
`verifiers.register`), a function that yields its `Item`s, and optionally the
prompt the base model is asked with and held-out items for transfer
(docs/flywheel.md, "Add a task"). Item ids are plain strings built from the
source's own indices and seeds, so they are equal in every process. The built-in tasks
are modules here, one each: `gsm8k`, `qa_wikidata` (experiments/flywheel.py --task=NAME).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
import dataclasses
import importlib
import inspect
from typing import Any

from graftjax.errors import GraftjaxError
from graftjax.flywheel import verifiers


class TaskError(GraftjaxError, ValueError):
  """A task whose items, held-out items or verifier cannot be run."""


@dataclasses.dataclass(frozen=True)
class Item:
  """One problem.

  Attributes:
    task: name of the task the item belongs to.
    id: stable id, unique within the task ('gsm8k/test/17').
    question: the problem text, without any prompt template.
    answer: the gold answer as the source writes it ('2,125', 'English').
    aliases: further accepted answers (QA).
    solution: the source's worked solution, when it has one.
    source: where the item was read: 'package==version:path'.
    split: the source's split ('test', 'generated', ...).
    template: the template the item instantiates, when it is one (shared by
      every source of that template: 'gsm8k/test/473').
  """

  task: str
  id: str
  question: str
  answer: str
  source: str
  split: str
  aliases: tuple[str, ...] = ()
  solution: str | None = None
  template: str | None = None

  @property
  def gold(self) -> tuple[str, ...]:
    return (self.answer, *self.aliases)

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self) | {'aliases': list(self.aliases)}

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> Item:
    return cls(**(data | {'aliases': tuple(data['aliases'])}))


@dataclasses.dataclass(frozen=True)
class Prompt:
  """How the base model is asked: `prefix` (few-shot examples) once, then `query` per item.

  `query` has a `{question}` field; the answer ends at a blank line.

  Attributes:
    prefix: the few-shot examples.
    query: the question's template.
    answer_only: answers are one short line (QA): base attempts stop at the
      line's end, a deposit holds the answer alone (`library.ANSWER_TEMPLATE`)
      and held-out items are asked in recall mode ('Final answer:').
    keep_prefix: held-out items asked through the library get the few-shot
      prefix after the grafted block, so the block is the one difference
      from the base model's prompt (`query` must then be the answer mode's
      query); otherwise the block alone precedes the query.
    code: answers are code (several lines): base attempts end at a closing
      fence, a deposit holds the code once in a fence (`library.CODE_TEMPLATE`)
      and recurring and held-out items are asked in code mode
      (`library.CODE_QUERY`, the query base attempts should use too).
    chat: every question is asked in the chat form of the model's chat template (an
      instruction-tuned checkpoint's `chat_template`): the few-shot prefix and the query
      as one user turn, the answer in the model's turn, ending at its end of turn; blocks
      are deposited as plain text either way (`answer.query_ids`).
  """

  prefix: str
  query: str
  answer_only: bool = False
  keep_prefix: bool = False
  code: bool = False
  chat: bool = False

  @property
  def base_mode(self) -> str:
    """The answer mode whose stop tokens end a base attempt (`answer.MODES`)."""
    return 'code' if self.code else 'recall' if self.answer_only else 'solve'

  @property
  def recall_mode(self) -> str:
    """How recurring items are asked through the library (`answer.MODES`)."""
    return 'code' if self.code else 'recall'

  @property
  def transfer_mode(self) -> str:
    """How held-out items are asked through the library (`answer.MODES`)."""
    return self.base_mode


@dataclasses.dataclass(frozen=True)
class Task:
  """A named stream of items, how the base model is asked, and the verifier of the answers.

  Attributes:
    name: the task's name (the deposited items' `Item.task`).
    verifier: a registered verifier's name ('numeric', 'alias', or one a
      module registered with `verifiers.register`), or a verifier itself.
    load: yields the items the base model attempts and the library deposits.
    prompt: how the base model is asked; None: zero-shot, 'Question: ...
      Solution:' (the library's solve query).
    held_out: yields items never deposited, answered by the base model and
      through the nearest block (transfer); None: recurrence only.
    targets: held-out item id -> the id of the deposited item its routing
      should find; None: each held-out item's `template`.
    unrelated: yields questions no deposited item answers; routers fitted in
      the run bound their false hits on them (None: on wrong hits of all).
    reworded: yields (query, deposited item id): other wordings of deposited
      questions. Without held-out items, routers are still fitted and reported
      on these, the deposited questions and `unrelated` (the run's `routing`).
    record: fields the result records about how the items were chosen.
  """

  name: str
  verifier: str | verifiers.Verifier
  load: Callable[[], Iterable[Item]]
  prompt: Prompt | None = None
  held_out: Callable[[], Iterable[Item]] | None = None
  targets: Mapping[str, str] | None = None
  unrelated: Callable[[], Iterable[str]] | None = None
  reworded: Callable[[], Iterable[tuple[str, str]]] | None = None
  record: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def checker(self) -> verifiers.Verifier:
    """The verifier (looked up by name at use, so it may be registered after the task)."""
    if isinstance(self.verifier, str):
      return verifiers.get(self.verifier)
    return self.verifier

  def items(self) -> Iterator[Item]:
    """The items in the source's order; refuses a foreign or repeated id."""
    seen = set()
    for item in self.load():
      if item.task != self.name:
        raise TaskError(f'item {item.id} is of task {item.task!r}, not {self.name!r}')
      if item.id in seen:
        raise TaskError(f'item id {item.id} repeats in task {self.name!r}')
      seen.add(item.id)
      yield item

  def held_out_items(self) -> list[Item]:
    """The held-out items (none without `held_out`); refuses a repeated id."""
    out = list(self.held_out()) if self.held_out is not None else []
    ids = [item.id for item in out]
    if repeated := sorted({i for i in ids if ids.count(i) > 1}):
      raise TaskError(f'held-out item ids repeat in task {self.name!r}: {repeated[:5]}')
    return out

  def verify(self, item: Item, text: str) -> verifiers.Verdict:
    """Checks answer text (cut at the caller's stop sequences) for `item`."""
    return self.checker(text, item.gold)


def load(spec: str) -> Task:
  """The task 'package.module:Name' names: `Name` is a `Task`, or a function of no arguments
  that returns one.

  Raises:
    TaskError: naming `spec` and the cause: the spec is malformed, the module cannot be
      imported, `Name` is missing, needs arguments or is no `Task`, or the user's code
      raises or calls `sys.exit` (a task never ends the caller).
  """
  module, _, name = spec.partition(':')
  if not module or not name:
    raise TaskError(f'task {spec!r} is not package.module:Name')
  with verifiers.plugin_failures(f'task {spec!r} cannot be loaded', TaskError):
    found = getattr(importlib.import_module(module), name)
  if callable(found) and not isinstance(found, Task):
    try:
      inspect.signature(found).bind()
    except TypeError as e:
      raise TaskError(f'task {spec!r} needs arguments ({e}): give a function of none') from e
    except ValueError:  # no signature to inspect (a builtin): the call says
      pass
    with verifiers.plugin_failures(f'task {spec!r}: its factory failed', TaskError):
      found = found()
  if not isinstance(found, Task):
    raise TaskError(f'task {spec!r} is a {type(found).__name__}, not a graftjax.flywheel.Task')
  return found
