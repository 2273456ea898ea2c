"""The flywheel loop end to end on the tiny model: every phase recorded, graft == prompt."""

import dataclasses

from graftjax.flywheel import library as library_lib
from graftjax.flywheel import route as route_lib
from graftjax.studies import flywheel


@dataclasses.dataclass(frozen=True)
class Item:
  task: str
  id: str
  question: str
  answer: str
  solution: str
  source_id: str | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
  correct: bool
  extracted: str

  def to_json(self):
    return {'correct': self.correct, 'extracted': self.extracted}


def last_word(text, gold):
  words = text.replace('.', ' ').split()
  return Verdict(bool(words) and words[-1] == gold, words[-1] if words else '')


def _item(i, a, b, source_id=None, prefix='q'):
  return Item(
    'toy', f'{prefix}{i}', f'What is {a} plus {b}?', str(a + b), f'{a} + {b} = {a + b}', source_id
  )


def test_the_loop_runs_and_records_every_phase(text_model, tmp_path):
  items = [_item(i, i, 2) for i in range(3)]
  held_out = [_item(i, i, 3, source_id=f'q{i}', prefix='h') for i in range(2)]
  library = library_lib.Library(tmp_path, shape=library_lib.Shape(capacity=256, chunk_size=16))
  budget = flywheel.Budget(samples=2, max_new_tokens=6, recall_tokens=4, rows=2)
  out = flywheel.run(
    text_model,
    task='toy',
    items=items,
    held_out=held_out,
    examples=[_item(9, 9, 9)],
    verify=last_word,
    library=library,
    budget=budget,
    routers=[route_lib.BM25Router(threshold=0.0), route_lib.ExactRouter()],
  )
  phases = [a['phase'] for a in out['attempts']]
  assert phases.count('base') == len(items) * budget.samples
  assert phases.count('transfer_base') == phases.count('transfer_flywheel') == len(held_out)
  assert len([d for d in out['deposits'] if d['key']]) == len(library.entries()) == len(items)
  unsolved = out['summary']['recurrence_items']
  assert phases.count('recurrence') == unsolved
  assert out['grafted_vs_prompted']['summary']['logits_byte_equal'] == unsolved
  assert set(out['routing']) == {'BM25Router', 'ExactRouter'}
  again = flywheel.run(
    text_model,
    task='toy',
    items=items,
    held_out=held_out,
    examples=[_item(9, 9, 9)],
    verify=last_word,
    library=library,
    budget=budget,
    routers=[route_lib.BM25Router(threshold=0.0)],
  )
  assert [d['key'] for d in again['deposits']] == [d['key'] for d in out['deposits']]
  assert library.store.list() == sorted(d['key'] for d in out['deposits'])
