"""BIG-bench qa_wikidata in pairs: per subject one fact deposited, one of another relation
held out (`task`)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from graftjax.flywheel import library as library_lib
from graftjax.flywheel import datasets
from graftjax.flywheel import tasks


WHY = (
  'qa_wikidata (facts) over arithmetic: a fact the model does not know is exactly what a'
  ' deposited block can supply, the dataset answer is its own reference (it passes the alias'
  ' verifier, source: reference), and two relations of one subject give a held-out question'
  ' that is different yet related; an arithmetic block holds only the sum of other numbers.'
)


@dataclasses.dataclass(frozen=True)
class Pairs:
  """qa_wikidata items in pairs: one deposited, one held out, about the same subject.

  Attributes:
    items: the deposited items, one per subject.
    held_out: per subject, a question of another relation (never deposited).
    targets: held-out item id -> its deposited partner's id (routing's truth).
    shots: few-shot examples for the base model, of other subjects.
    same_answer: held-out items whose gold equals their partner's gold.
  """

  items: list[Any]
  held_out: list[Any]
  targets: dict[str, str]
  shots: list[Any]
  same_answer: int


def pairs(
  task, count: int, *, seed: int = 0, shots: int = 5, min_relation_items: int = 100
) -> Pairs:
  """`count` subjects of BIG-bench qa_wikidata asked two questions of different relations.

  Only questions of the form 'The R of S is' whose relation R has at least
  `min_relation_items` items are used, and no question whose text occurs
  twice in the task (the same fact under two ids), so no held-out question
  text is a deposited one. Subjects with two such relations are shuffled by
  `seed`; for each of the first `count`, one question (shuffled) is deposited
  and the first of another relation is held out. The few-shot examples are
  questions of subjects with a single question, one per relation.

  Args:
    task: `datasets.bigbench_qa_wikidata()` (or any task of such questions).
    count: subjects (pairs).
    seed: the shuffle's seed.
    shots: few-shot examples.
    min_relation_items: relations with fewer items are left out.
  Raises:
    ValueError: fewer than `count` subjects, or `shots` single subjects, qualify.
  """
  items = list(task.items())
  texts: dict[str, int] = {}
  for item in items:
    texts[item.question] = texts.get(item.question, 0) + 1
  parsed = [(item, datasets.wikidata_relation(item.question)) for item in items]
  relations: dict[str, int] = {}
  for _, rs in parsed:
    if rs:
      relations[rs[0]] = relations.get(rs[0], 0) + 1
  subjects: dict[str, list[tuple[str, Any]]] = {}
  for item, rs in parsed:
    if rs and relations[rs[0]] >= min_relation_items and texts[item.question] == 1:
      subjects.setdefault(rs[1], []).append((rs[0], item))
  rng = random.Random(seed)
  paired = sorted(s for s, qs in subjects.items() if len({r for r, _ in qs}) > 1)
  single = sorted(s for s, qs in subjects.items() if len(qs) == 1)
  if len(paired) < count:
    raise ValueError(f'{len(paired)} subjects have two relations, {count} asked for')
  rng.shuffle(paired)
  deposited, held_out = [], []
  for subject in paired[:count]:
    questions = list(subjects[subject])
    rng.shuffle(questions)
    relation, item = questions[0]
    other = next(o for r, o in questions[1:] if r != relation)
    deposited.append(item)
    held_out.append(other)
  rng.shuffle(single)
  examples, used = [], set()
  for subject in single:
    relation, item = subjects[subject][0]
    if relation not in used and len(examples) < shots:
      examples.append(item)
      used.add(relation)
  if len(examples) < shots:
    raise ValueError(f'{len(examples)} relations give few-shot examples, {shots} asked for')

  def gold(item) -> set[str]:  # the verifier's normal forms of the gold and its aliases
    return set(task.checker('', item.gold).gold)

  return Pairs(
    items=deposited,
    held_out=held_out,
    targets={h.id: d.id for d, h in zip(deposited, held_out)},
    shots=examples,
    same_answer=sum(bool(gold(h) & gold(d)) for d, h in zip(deposited, held_out)),
  )


def task(count: int, *, seed: int = 0, shots: int = 5) -> tasks.Task:
  """BIG-bench qa_wikidata: per subject one fact deposited, one of another relation held out."""
  qa = datasets.bigbench_qa_wikidata()
  chosen = pairs(qa, count, seed=seed, shots=shots)
  prefix = ''.join(
    library_lib.ANSWER_TEMPLATE.format(question=i.question, answer=i.answer) for i in chosen.shots
  )
  selection = {
    'why': WHY,
    'pairs': count,
    'shots': [i.id for i in chosen.shots],
    'held_out': (
      'per subject, a question of another relation than its deposited one; no question text'
      ' occurs twice in the task, so no held-out question is a deposited one (ids and texts'
      ' disjoint); the few-shot examples are of other subjects'
    ),
    'held_out_same_answer': chosen.same_answer,
    'transfer_flywheel': (
      "the routed block grafted before the base model's own few-shot prompt and question,"
      ' so the block is the one difference between the two transfer conditions'
    ),
    'targets': chosen.targets,
  }
  return tasks.Task(
    qa.name,
    'alias',
    lambda: chosen.items,
    prompt=tasks.Prompt(prefix, library_lib.RECALL_QUERY, answer_only=True, keep_prefix=True),
    held_out=lambda: chosen.held_out,
    targets=chosen.targets,
    record={'selection': selection},
  )
