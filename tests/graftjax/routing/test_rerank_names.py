"""The rerank of `HybridRouter` on a needle set with values that are not numbers: the page
naming the whole subject before notes naming its first name, and copies of one note taking
one candidate's place, not several."""

import json

import numpy as np
import pytest

from graftjax.routing import route as route_lib
from graftjax.routing import units as units_lib


def _byte_ids(text: str) -> list[int]:
  return [3 + b % 253 for b in text.encode()]


TINY = {'unit_words': 16, 'chunk_size': 8, 'batch_size': 2, 'encode': _byte_ids}
FILLER = ' '.join(f'word{i}' for i in range(40))
QUESTION = 'What colour is the car of Marguerite Okonkwo?'
# The fact's page names the whole subject; 40 short notes repeat the question's words and the
# first name; other people share the first or the last name.
STORE = [
  ('long/fact', f'{FILLER} Marguerite Okonkwo drives a teal car. {FILLER}'),
  ('long/other', f'{FILLER} Dorian Okonkwo teaches Latin at the school. {FILLER}'),
  *[
    (f'long/m{i}', f'{FILLER} Marguerite {last} lives in {city}. {FILLER}')
    for i, (last, city) in enumerate([('Abernathy', 'Lyon'), ('Vasquez', 'Porto')])
  ],
  *[(f'note/{j}', f'What colour is the car of Marguerite? Ask at desk{j}.') for j in range(40)],
  *[(f'pad/{i:03}', f'pad{i} text{i % 7} more{i % 11}') for i in range(60)],
]


def _prefers_notes(model, query, contexts, **kwargs):
  """A reranker fooled by the question's words: gain 1 for a context repeating them, 0.5 for
  one naming Marguerite alone, else 0."""
  del model, query, kwargs
  return np.asarray([1.0 if 'What colour' in c else 0.5 * ('Marguerite' in c) for c in contexts])


def _router(model, **kwargs):
  router = units_lib.HybridRouter(
    model, threshold=-np.inf, rerank=4, rerank_rare=4, **{**TINY, **kwargs}
  )
  router.add_many(STORE)
  return router


def test_the_rare_words_of_the_name_weigh_for_the_whole_subject():
  lexical = units_lib.UnitRouter(threshold=-np.inf, unit_words=16)
  lexical.add_many(STORE)
  assert lexical.rare_words(QUESTION) == ['okonkwo']  # the notes hold the rest
  note, other, fact = lexical.rare_weights(QUESTION, [STORE[4][1], STORE[1][1], STORE[0][1]])
  assert fact == other > note == 0


@pytest.mark.parametrize('names, first', [(True, 'long/fact'), (False, 'note/')])
def test_the_rerank_puts_the_page_naming_the_whole_subject_first(
  tiny_model, monkeypatch, names, first
):
  monkeypatch.setattr(units_lib, 'query_gain', _prefers_notes)
  hits = _router(tiny_model, rerank_names=names).route(QUESTION, k=8)
  assert 'long/fact' in [h.key for h in hits]  # a candidate either way
  assert hits[0].key.startswith(first)


def _copies(n):
  return [
    (f'copy/{j}', 'Which locker belongs to Bartholomew Quarshie? See the list.') for j in range(n)
  ]


def test_copies_of_one_note_take_one_candidates_place(tiny_model, monkeypatch):
  query = 'Which locker belongs to Bartholomew Quarshie?'
  fact = ('long/fact', f'{FILLER} Bartholomew Quarshie has locker 4821. {FILLER}')
  pages = [fact, *_copies(4), ('long/other', f'{FILLER} Amelia Abernathy has locker 17. {FILLER}')]
  lexical = units_lib.UnitRouter(threshold=-np.inf, unit_words=16)
  lexical.add_many(pages)
  assert [h.key for h in lexical.route(query, 5)][:4] == [f'copy/{j}' for j in range(4)]
  seen = []

  def knows(model, q, contexts, **kwargs):
    seen.append(list(contexts))
    return np.asarray([float('4821' in c) for c in contexts])

  monkeypatch.setattr(units_lib, 'query_gain', knows)
  router = units_lib.HybridRouter(
    tiny_model, threshold=-np.inf, rerank=4, rerank_names=False, **TINY
  )
  router.add_many(pages)
  hits = router.route(query, k=4)
  assert hits[0].key == 'long/fact'
  assert sum(h.key.startswith('copy/') for h in hits) == 1
  (contexts,) = seen
  assert len(contexts) == len(set(contexts)) == 3  # one copy, the fact, the other page


def test_rerank_names_is_saved_checked_and_off_in_older_files(tiny_model, tmp_path):
  path = tmp_path / 'hybrid.json'
  _router(tiny_model).save(path)
  assert units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids).rerank_names
  body = json.loads(path.read_text())
  del body['rerank_names'], body['sha256']
  empty = route_lib._matrix_bytes(np.zeros((0, tiny_model.config.embed_dim), np.float32))
  route_lib._write_json(path, body, empty)
  assert not units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids).rerank_names
  route_lib._write_json(path, {**body, 'rerank_names': 'yes'}, empty)
  with pytest.raises(route_lib.RouterFileError, match='rerank_names must be a bool'):
    units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids)
