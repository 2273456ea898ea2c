"""A router's ranking is a function of the query and the stored entries alone: not of how many
queries are routed together, nor of the order the entries were added in."""

import itertools
import math
import random

import numpy as np
import pytest

from graftjax.routing import route
from graftjax.routing import units as units_lib

WORDS = 'apple train violin glacier bread chess lava ocean tulip rocket book runner'.split()


def _byte_ids(text: str) -> list[int]:
  """A tokenizer for the tiny model (vocabulary 256; ids 0-2 are pad, eos, bos)."""
  return [3 + b % 253 for b in text.encode()]


EMBED = {'chunk_size': 8, 'batch_size': 8, 'encode': _byte_ids}


def _entries() -> list[tuple[str, str]]:
  """Short texts (at most 15 bytes: two chunks of the tiny model), some sharing words, some
  repeated under other keys (exact ties)."""
  pairs = [f'{a} {b}' for a, b in itertools.combinations(WORDS[:8], 2)][:20]
  out = [(f'k{i:02d}', text) for i, text in enumerate(pairs)]
  return out + [('twin/a', 'lava ocean'), ('twin/b', 'lava ocean'), ('solo', 'rocket')]


def _queries(n: int = 64) -> list[str]:
  rng = random.Random(0)
  out = [text for _, text in _entries()]
  while len(out) < n:
    out.append(' '.join(rng.sample(WORDS, rng.choice((1, 2)))))
  return out[:n]


def _routers(model):
  yield 'exact', route.ExactRouter()
  yield 'bm25', route.BM25Router(threshold=-math.inf)
  yield 'units', units_lib.UnitRouter(threshold=-math.inf, unit_words=2, stride_words=1)
  yield 'embedding', route.EmbeddingRouter(model, threshold=-math.inf, **EMBED)
  yield 'hybrid', units_lib.HybridRouter(model, threshold=-math.inf, weight=0.5, **EMBED)
  yield 'rerank', units_lib.HybridRouter(model, threshold=-math.inf, weight=1.0, rerank=3, **EMBED)


def _bits(hits_per_query):
  return [[(h.key, float(h.score).hex()) for h in hits] for hits in hits_per_query]


@pytest.mark.parametrize(
  'name',
  [
    'exact',
    'bm25',
    'units',
    *(pytest.param(name, marks=pytest.mark.slow) for name in ('embedding', 'hybrid', 'rerank')),
  ],
)
def test_route_many_equals_route_bit_for_bit_at_every_batch_size(tiny_model, name):
  """The embedding router scored a batch with one BLAS matmul: 0/100 top-3 lists equal."""
  router = dict(_routers(tiny_model))[name]
  router.add_many(_entries())
  queries = _queries()
  k = 3
  alone = _bits([router.route(q, k) for q in queries])
  for size in range(1, 65):
    begin = (7 * size) % (len(queries) - size + 1)  # each size at another offset
    batch = queries[begin : begin + size]
    assert _bits(router.route_many(batch, k)) == alone[begin : begin + size], size


def test_a_stored_text_scores_exactly_one_with_the_embedding_router(tiny_model):
  router = route.EmbeddingRouter(tiny_model, threshold=-math.inf, **EMBED)
  router.add_many(_entries())
  texts = [text for _, text in _entries()]
  for text, hits in zip(texts, router.route_many(texts, 1)):
    assert hits[0].score == 1.0, text


def test_similarities_depend_on_the_two_rows_alone():
  rng = random.Random(1)
  rows = [[rng.gauss(0, 1) for _ in range(48)] for _ in range(9)]
  matrix = np.asarray(rows, np.float32)
  whole = route.similarities(matrix, matrix)
  assert whole.dtype == np.float32 and whole.shape == (9, 9)
  for i in range(9):
    assert route.similarities(matrix[i : i + 1], matrix[::-1]).tobytes() == (
      whole[i : i + 1, ::-1].tobytes()
    )
  many = route.similarities(np.tile(matrix, (15, 1)), matrix)  # 135 queries, over a block
  assert many.tobytes() == np.tile(whole, (15, 1)).tobytes()
  norms = np.linalg.norm(matrix, axis=1)
  np.testing.assert_allclose(whole, matrix @ matrix.T / np.outer(norms, norms), atol=1e-6)
  assert (np.diag(whole) == 1.0).all()
  with pytest.raises(ValueError, match=r'\[Q, D\] and \[N, D\]'):
    route.similarities(matrix[:, :4], matrix)


# Ties ------------------------------------------------------------------------------------------

FACT = 'The access code of Amelia Blackwood is 4821.'
QUESTION = 'What is the access code of Amelia Blackwood?'
FILLER = 'lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor'.split()


def _overlapping_pages() -> list[tuple[str, str]]:
  """Two overlapping pages of one text whose fact a plain boundary cuts after the question's
  words: 'a' ends with them, 'b' holds the whole fact (the answer and more after it)."""
  words = FILLER + FACT.split() + FILLER
  cut = len(FILLER) + FACT.split().index('is')  # 'a' ends before 'is 4821.'
  return [('a', ' '.join(words[:cut])), ('b', ' '.join(words[cut - 8 :]))]


def test_the_page_holding_the_whole_fact_wins_a_tie():
  """The page holding only the question's words tied exactly and won by insertion order."""
  pages = _overlapping_pages()
  for order in (pages, pages[::-1]):
    router = units_lib.UnitRouter(threshold=-math.inf, unit_words=64)
    router.add_many(order)
    first, second = router.route(QUESTION, 2)
    assert first.score == second.score  # every question word in both (b=0)
    assert (first.key, second.key) == ('b', 'a')
  assert route.span_room(QUESTION, pages[0][1]) == (0, len(FILLER) + 1)  # after 'The'
  assert route.span_room(QUESTION, pages[1][1])[0] == len(FILLER) + 2


def test_span_room_by_hand():
  assert route.span_room('code alice', 'code x y alice code z alice w') == (3, 3)
  assert route.span_room('Alice?', 'x Alice y z') == (2, 1)
  assert route.span_room('the of', 'x the of y') == (0, 0)  # stopwords only
  assert route.span_room('zebra', 'code x') == (0, 0)


@pytest.mark.parametrize('name', ['exact', 'bm25', 'units', 'embedding', 'hybrid', 'rerank'])
def test_rankings_do_not_depend_on_the_order_entries_were_added(tiny_model, name):
  """Tied keys came in insertion order, and BM25's term ids (so its sums) followed it."""
  entries = _entries()
  shuffled = entries[:]
  random.Random(2).shuffle(shuffled)
  routed = []
  for order in (entries, shuffled, sorted(entries, reverse=True)):
    router = dict(_routers(tiny_model))[name]
    router.add_many(order)
    routed.append(_bits(router.route_many(_queries(24), 4)))
  assert routed[0] == routed[1] == routed[2]


def test_ties_go_to_the_key_then_the_text():
  router = route.ExactRouter()
  router.add_many([('z', 'Same?'), ('b', 'same'), ('m', 'SAME'), ('b', 'same!')])
  assert [h.key for h in router.route('same', 3)] == ['b', 'm', 'z']
  assert route.tie_order('same', 'b', 'same') < route.tie_order('same', 'b', 'same!')
