"""The flywheel loop end to end on the tiny model: every phase recorded, graft == prompt."""

from graftjax.flywheel import library as library_lib
from graftjax.flywheel import route as route_lib
from graftjax.flywheel import tasks
from graftjax.flywheel import verifiers
from graftjax.studies import flywheel


def last_word(text, gold):
  words = text.replace('.', ' ').split()
  return verifiers.Verdict(
    bool(words) and words[-1] in gold, words[-1] if words else None, tuple(gold), 'last_word', 1
  )


def _item(i, a, b, template=None, prefix='q'):
  return tasks.Item(
    task='toy',
    id=f'{prefix}{i}',
    question=f'What is {a} plus {b}?',
    answer=str(a + b),
    solution=f'{a} + {b} = {a + b}',
    source='test',
    split='test',
    template=template,
  )


PROMPT = flywheel.Prompt(
  prefix='Question: What is 9 plus 9?\nSolution: 18\n\n', query='Question: {question}\nSolution:'
)


def test_the_loop_runs_and_records_every_phase(text_model, tmp_path):
  items = [_item(i, i, 2) for i in range(3)]
  held_out = [_item(i, i, 3, template=f'q{i}', prefix='h') for i in range(2)]
  library = library_lib.Library(tmp_path, shape=library_lib.Shape(capacity=256, chunk_size=16))
  budget = flywheel.Budget(samples=2, max_new_tokens=6, recall_tokens=4, rows=2)

  def run(routers):
    return flywheel.run(
      text_model,
      task='toy',
      items=items,
      held_out=held_out,
      prompt=PROMPT,
      verify=last_word,
      library=library,
      budget=budget,
      routers=routers,
    )

  out = run([route_lib.BM25Router(threshold=0.0), route_lib.ExactRouter()])
  phases = [a['phase'] for a in out['attempts']]
  assert phases.count('base') == len(items) * budget.samples
  assert phases.count('transfer_base') == phases.count('transfer_flywheel') == len(held_out)
  assert len([d for d in out['deposits'] if d['key']]) == len(library.entries()) == len(items)
  unsolved = out['summary']['recurrence_items']
  assert phases.count('recurrence') == unsolved
  assert out['grafted_vs_prompted']['summary']['logits_byte_equal'] == unsolved
  assert set(out['routing']) == {'BM25Router', 'ExactRouter'}
  again = run([route_lib.BM25Router(threshold=0.0)])
  assert [d['key'] for d in again['deposits']] == [d['key'] for d in out['deposits']]
  assert all(d['existing'] for d in again['deposits'])
  assert not any(d.get('existing') for d in out['deposits'])
  assert library.store.list() == sorted(d['key'] for d in out['deposits'])
