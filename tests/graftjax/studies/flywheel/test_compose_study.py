"""The composition study on the tiny model (byte tokenizer, Pallas interpreter): every layout
checked against a fresh block-attention prefill, every arm answered and summarised."""

import pytest

from graftjax import compose as compose_lib
from graftjax.flywheel import library as library_lib
from graftjax.flywheel import loop
from graftjax.flywheel import tasks
from graftjax.flywheel import verifiers
from graftjax.models.gemma import config as gemma_config
from graftjax.models.gemma import model as gemma_model
from graftjax.studies.flywheel import compose

SETUP = compose.Setup(capacity=1024, chunk_size=16, recall_tokens=4, solve_tokens=6)


def last_word(text, gold):
  words = text.replace('.', ' ').split()
  return verifiers.Verdict(
    bool(words) and words[-1] in gold, words[-1] if words else None, tuple(gold), 'last_word', 1
  )


def _item(i, a, b, *, prefix='q', template=None, solution=None):
  return tasks.Item(
    task='toy',
    id=f'{prefix}{i}',
    question=f'What is {a} plus {b}?',
    answer=str(a + b),
    solution=solution or f'{a} + {b} = {a + b}',
    source='test',
    split='test',
    template=template,
  )


@pytest.fixture(scope='module')
def model():
  """The tiny model cut to one sliding-window layer and one global layer: the interpreter runs
  a third of the layers."""
  two = gemma_model.tiny(attention_types=gemma_config.attention_pattern(2, local_per_global=1))
  return two.with_position_scheme('rope_relative').with_impl('pallas')


@pytest.mark.slow
def test_the_study_checks_every_layout_and_answers_every_arm(model, tmp_path):
  items = [_item(i, i, 2) for i in range(3)] + [_item(3, 1, 1, solution='1 + 1 = 3')]
  held_out = [_item(i, i, 5, prefix='h', template=f'q{i}') for i in range(2)]
  library = library_lib.Library(tmp_path, shape=library_lib.Shape(capacity=1024, chunk_size=16))
  deposits = loop.deposit_verified(model, library, items, last_word)
  assert [d['source'] for d in deposits] == ['reference'] * 4
  assert deposits[3]['key'] is None and 'does not verify' in deposits[3]['refused']
  out = compose.run(
    model, library=library, items=items, held_out=held_out, verify=last_word, setup=SETUP
  )
  # The item whose reference solution did not verify has no block: it is not asked.
  assert [r['item_id'] for r in out['recall']] == ['q0', 'q1', 'q2']
  for record in out['recall']:
    assert len(record['distractors']) == 2 and record['own_key'] not in record['distractors']
    assert [(c['k'], c['layout']) for c in record['exact']] == [
      (k, name) for k in SETUP.ks for name in compose.LAYOUTS
    ]
    for check in record['exact']:
      assert check['logits_byte_equal'] and check['cache_byte_equal'], check
      assert check['max_abs_logit_diff'] == 0.0
      assert all(s % out['page'] == 0 for s in check['slots'])
    packed, shifted = record['exact'][-2:]
    assert [s + out['page'] for s in packed['slots']] == shifted['slots']
    assert packed['positions'] == shifted['positions']
    assert set(record['answers']) == {'k1', 'k2', 'k3', 'k3_own_first'}
    assert record['answers']['k3']['keys'][-1] == record['own_key']
    assert record['answers']['k3_own_first']['keys'][0] == record['own_key']
  s = out['summary']
  assert s['exactness']['k3/shifted'] == {
    'total': 3,
    'logits_byte_equal': 3,
    'cache_byte_equal': 3,
    'max_abs_logit_diff': 0.0,
  }
  assert s['recall']['k1']['items'] == 3 and s['held_out']['top3']['items'] == 2
  assert s['paired']['k1 vs k3']['items'] == 3 and s['paired']['top1 vs top3']['items'] == 2
  for record in out['held_out']:
    assert len(record['answers']['top3']['keys']) == 3
    assert record['answers']['top1']['keys'] == [record['routed'][0]['key']]
  assert 'recall' in compose.format_summary(out)


def test_a_model_that_cannot_compose_is_refused_before_any_work(model, tmp_path):
  library = library_lib.Library(tmp_path, shape=library_lib.Shape(capacity=1024, chunk_size=16))
  with pytest.raises(compose_lib.ComposeError, match='splits anchored at absolute slots'):
    compose.run(
      model.with_impl('xla'),
      library=library,
      items=[_item(0, 1, 2)],
      held_out=[],
      verify=last_word,
      setup=SETUP,
    )
  reasons = compose.refusals(model)
  assert (
    'splits anchored at absolute slots' in reasons['xla'] and 'rope_relative' in reasons['rope']
  )


def test_setup_refuses_empty_block_counts():
  with pytest.raises(ValueError, match='ks must be counts of blocks'):
    compose.Setup(ks=(0, 1))
  with pytest.raises(ValueError, match='held_out_ks'):
    compose.Setup(held_out_ks=())


@pytest.mark.slow
def test_own_verified_attempts_are_deposited_and_a_passed_deadline_asks_nothing(model, tmp_path):
  items = [_item(i, i, 2) for i in range(2)]
  library = library_lib.Library(tmp_path, shape=library_lib.Shape(capacity=1024, chunk_size=16))
  text = 'We add: 2'
  base = [
    {
      'item_id': 'q0',
      'text': text,
      'decode_tokens': 9,
      'verdict': last_word(text, items[0].gold).to_json(),
    },
    {'item_id': 'q1', 'text': 'no', 'decode_tokens': 2, 'verdict': {'verdict': False}},
  ]
  deposits = loop.deposit_verified(model, library, items, last_word, base)
  assert [d['source'] for d in deposits] == ['self', 'reference']
  assert library.find('toy', 'q0').tokens_spent == 9
  out = compose.run(
    model,
    library=library,
    items=items,
    held_out=[_item(0, 0, 5, prefix='h', template='q0')],
    verify=last_word,
    setup=SETUP,
    deadline=0.0,
  )
  assert out['recall'] == out['held_out'] == []
  assert out['not_asked'] == {'recall': 2, 'held_out': 1}
