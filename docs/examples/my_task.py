"""A task of one's own: capitals of made-up countries, checked by a verifier of one's own.

  PYTHONPATH=docs/examples python experiments/flywheel.py --task=my_task:TASK --model=tiny \
      --max_new_tokens=8 --recall_tokens=8 --capacity=256 --out=/tmp/my_task.json
  PYTHONPATH=docs/examples python -m graftjax.flywheel.rescore --verifiers=my_task /tmp/my_task.json
"""

from graftjax import flywheel
from graftjax.flywheel import library
from graftjax.flywheel import verifiers

COUNTRIES = [('Zorbia', 'Zed', 'Zorbish'), ('Quantar', 'Quill', 'Quan'), ('Morvel', 'Mor', 'Vel')]
SHOT = library.ANSWER_TEMPLATE.format(question='The capital of France is', answer='Paris')


def first_word(text, gold):
  """Right when the answer's first word is a gold answer, case aside."""
  words, gold = text.replace('.', ' ').split(), [g.lower() for g in gold]
  found = words[0].lower() if words else None
  return verifiers.Check(found in gold, found, gold)


verifiers.register('first_word', 1, first_word)


def item(split, i, question, answer):
  return flywheel.Item('capitals', f'{split}/{i}', question, answer, 'my_task.py', split)


TASK = flywheel.Task(
  name='capitals',
  verifier='first_word',
  load=lambda: [
    item('dep', i, f'The capital of {c} is', a) for i, (c, a, _) in enumerate(COUNTRIES)
  ],
  # few-shot examples in the library's form, its recall query; held out: the block, then these
  prompt=flywheel.Prompt(SHOT, library.RECALL_QUERY, answer_only=True, keep_prefix=True),
  held_out=lambda: [
    item('new', i, f'The language of {c} is', a) for i, (c, _, a) in enumerate(COUNTRIES)
  ],
  targets={f'new/{i}': f'dep/{i}' for i in range(len(COUNTRIES))},  # what routing should find
)
