"""The task interface: items with a gold answer, and the verifier that checks them.

Any dataset plugs in by giving a `Task` a name, a verifier and a function that
yields its `Item`s (see `datasets`). Item ids are plain strings built from the
source's own indices and seeds, so they are equal in every process.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Iterator

from graftjax.flywheel import verifiers


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
class Task:
  """A named stream of items and the verifier for their answers."""

  name: str
  verifier: verifiers.Verifier
  load: Callable[[], Iterable[Item]]

  def items(self) -> Iterator[Item]:
    """The items in the source's order; refuses a foreign or repeated id."""
    seen = set()
    for item in self.load():
      if item.task != self.name:
        raise ValueError(f'item {item.id} is of task {item.task!r}, not {self.name!r}')
      if item.id in seen:
        raise ValueError(f'item id {item.id} repeats in task {self.name!r}')
      seen.add(item.id)
      yield item

  def verify(self, item: Item, text: str) -> verifiers.Verdict:
    """Checks answer text (cut at the caller's stop sequences) for `item`."""
    return self.verifier(text, item.gold)
