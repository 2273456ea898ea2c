"""Routers (exact, BM25, the model's embedding), their evaluation, and the 'hidden' forward mode."""

import dataclasses
import json
import math

import numpy as np
import pytest

from graftjax import stats
from graftjax.models.gemma import model as gemma_model
from graftjax.routing import route

GSM = {
  'natalia': 'Natalia sold clips to 48 of her friends in April, and then she sold half as many'
  ' clips in May. How many clips did Natalia sell altogether in April and May?',
  'weng': 'Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of'
  ' babysitting. How much did she earn?',
  'betty': 'Betty is saving money for a new wallet which costs $100. Betty has only half of the'
  ' money she needs. Her parents decided to give her $15 for that purpose, and her grandparents'
  ' twice as much as her parents. How much more money does Betty need to buy the wallet?',
  'james': 'James writes a 3-page letter to 2 different friends twice a week. How many pages'
  ' does he write a year?',
}
SIBLINGS = {  # the same template, other numbers
  'natalia': 'Natalia sold clips to 36 of her friends in April, and then she sold a third as'
  ' many clips in May. How many clips did Natalia sell altogether in April and May?',
  'weng': 'Weng earns $15 an hour for babysitting. Yesterday, she just did 40 minutes of'
  ' babysitting. How much did she earn?',
  'james': 'James writes a 5-page letter to 3 different friends twice a week. How many pages'
  ' does he write a year?',
}
UNRELATED = [
  'The capital of France is Paris; which river flows through it?',
  'Who wrote the novel War and Peace?',
]


@pytest.mark.parametrize(
  'text, normal',
  [
    ('What is 2+2?', 'what is 2+2'),
    ('  «What   is\t2+2?»\n', 'what is 2+2'),
    ('Ｗｈａｔ　ｉｓ　２＋２？', 'what is 2+2'),  # fullwidth: NFKC
    ('STRASSE', 'strasse'),
    ('Straße', 'strasse'),  # casefold, not lower
    ('$5, please.', '$5, please'),  # symbols and inner punctuation stay
    ('"(...)"', ''),
  ],
)
def test_normalize(text, normal):
  assert route.normalize(text) == normal


def test_exact_router_routes_recurrences_only():
  router = route.ExactRouter()
  router.add_many([('k1', 'What is 2+2?'), ('k2', 'What is 2+3?')])
  assert router.route('  what IS 2+2 ') == [route.Hit('k1', 1.0)]
  assert router.route('what is 2 + 2') == []
  assert router.route('') == []


def test_router_entries_are_idempotent_and_keys_distinct():
  router = route.ExactRouter()
  assert router.add('k1', 'Same question?')
  assert not router.add('k1', 'Same question?')
  assert router.add('k1', 'same question')  # another text of the same key
  assert router.add('k2', 'SAME QUESTION')
  assert len(router) == 3
  assert router.route('same question', k=3) == [route.Hit('k1', 1.0), route.Hit('k2', 1.0)]
  with pytest.raises(ValueError, match='normalises to empty'):
    router.add('k3', ' ?! ')
  with pytest.raises(ValueError, match='k must be'):
    router.route('same question', k=0)


def _bm25():
  router = route.BM25Router(threshold=0.5)
  router.add_many(GSM.items())
  return router


def test_bm25_routes_a_template_sibling_and_abstains_on_unrelated_text():
  router = _bm25()
  for key, sibling in SIBLINGS.items():
    (hit,) = router.route(sibling)
    assert hit.key == key and 0.5 <= hit.score < 1.0
  for text in UNRELATED:
    assert router.route(text) == []
    assert all(hit.score < 0.5 for hit in router.route(text, k=4, threshold=-math.inf))


def test_bm25_scores_are_fractions_of_the_self_score():
  router = _bm25()
  assert router.route(GSM['weng']) == [route.Hit('weng', 1.0)]
  assert router.route(GSM['weng'].upper() + ' And more words.')[0].score == 1.0
  hits = router.route(SIBLINGS['james'], k=4, threshold=-math.inf)
  assert [h.key for h in hits][0] == 'james' and all(0 < h.score <= 1 for h in hits)
  assert router.route('the and of a') == []  # stopwords only
  assert router.route('zebra quantum') == []  # nothing in the vocabulary


def test_bm25_rebuilds_after_adds_and_round_trips(tmp_path):
  router = route.BM25Router(threshold=0.5)
  assert router.route(GSM['natalia']) == []
  router.add('natalia', GSM['natalia'])
  assert router.route(SIBLINGS['natalia'])[0].key == 'natalia'
  router.add_many(GSM.items())
  expected = router.route_many(list(SIBLINGS.values()), k=2, threshold=0.0)
  router.save(tmp_path / 'bm25.json')
  loaded = route.BM25Router.load(tmp_path / 'bm25.json')
  assert loaded.entries == router.entries and loaded.threshold == 0.5
  assert loaded.route_many(list(SIBLINGS.values()), k=2, threshold=0.0) == expected
  with pytest.raises(route.RouterFileError, match="not 'exact'"):
    route.ExactRouter.load(tmp_path / 'bm25.json')


def _edit(path, change):
  body = json.loads(path.read_text())
  change(body)
  path.write_text(json.dumps(body))


@pytest.mark.parametrize(
  'change, match',
  [
    (lambda body: body['entries'].reverse(), 'SHA-256'),  # keys paired with other texts
    (lambda body: body['entries'][0].__setitem__(1, 'another text'), 'SHA-256'),
    (lambda body: body.__setitem__('threshold', 0.0), 'SHA-256'),
    (lambda body: body.pop('sha256'), 'no sha256'),
  ],
)
def test_bm25_file_is_checked_against_its_digest(tmp_path, change, match):
  """BM25 files had no digest: an edited file loaded and routed to whatever it said."""
  path = tmp_path / 'bm25.json'
  _bm25().save(path)
  _edit(path, change)
  with pytest.raises(route.RouterFileError, match=match):
    route.BM25Router.load(path)


@pytest.mark.parametrize('data', [b'', b'{not json', b'[1, 2]', b'[' * 100_000])
def test_a_damaged_router_file_is_a_router_file_error(tmp_path, data):
  path = tmp_path / 'bm25.json'
  path.write_bytes(data)
  with pytest.raises(route.RouterFileError, match='not a router file'):
    route.BM25Router.load(path)
  with pytest.raises(route.RouterFileError, match='cannot read'):
    route.BM25Router.load(tmp_path / 'missing.json')


def _byte_ids(text: str) -> list[int]:
  """A tokenizer for the tiny model (vocabulary 256; ids 0-2 are pad, eos, bos)."""
  return [3 + b % 253 for b in text.encode()]


# Every tiny-model call shares one compiled shape (batch 2, chunk 8, capacity 64): texts
# of at most 63 bytes.
TINY = {'chunk_size': 8, 'batch_size': 2, 'encode': _byte_ids}
SHORT = {key: text[:48] for key, text in GSM.items()}


def test_hidden_mode_is_the_state_before_the_output_projection(tiny_model):
  tokens = np.array([[5, 9, 17, 33, 65, 3, 4, 6], [7, 11, 13, 19, 23, 29, 31, 37]], np.int32)
  positions = np.broadcast_to(np.arange(8, dtype=np.int32), tokens.shape)
  run = lambda mode: tiny_model.forward(
    tokens, positions, tiny_model.init_cache(batch_size=2, capacity=64), logits=mode
  )[0]
  hidden, logits = np.asarray(run('hidden')), np.asarray(run('all'))
  assert hidden.shape == (2, 8, tiny_model.config.embed_dim) and hidden.dtype == np.float32
  table = np.asarray(tiny_model.params['embedding'], np.float32)
  np.testing.assert_allclose(hidden @ table.T, logits, rtol=1e-5, atol=1e-5)


def test_embeddings_are_deterministic_unit_vectors(tiny_model):
  texts = ['How many clips did Natalia sell?', 'short', 'x' * 20]
  embed = lambda ts: route.embed_texts(tiny_model, ts, **TINY)
  together = embed(texts)
  assert together.shape == (3, tiny_model.config.embed_dim) and together.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, rtol=1e-6)
  for i, text in enumerate(texts):  # the same bits alone or beside others, in any order
    assert embed([text]).tobytes() == together[i].tobytes()
  assert embed(texts[::-1]).tobytes() == together[::-1].tobytes()
  ids = route.embed_texts(tiny_model, [_byte_ids(texts[0])], chunk_size=8, batch_size=2)
  assert ids.tobytes() == together[0].tobytes()
  with pytest.raises(ValueError, match='no tokenizer'):  # a checkpoint without tokenizer files
    route.embed_texts(dataclasses.replace(tiny_model, tokenizer=None), texts)


def test_embedding_router_self_similarity_and_threshold(tiny_model):
  router = route.EmbeddingRouter(tiny_model, threshold=0.0, **TINY)
  router.add_many(SHORT.items())
  for key, text in SHORT.items():
    (hit,) = router.route(text, threshold=-math.inf)
    assert hit.key == key and hit.score == pytest.approx(1.0, abs=1e-6)
  (best,) = router.route(UNRELATED[0], threshold=-math.inf)
  assert best.score < 1.0
  assert router.route(UNRELATED[0], threshold=best.score) == [best]
  assert router.route(UNRELATED[0], threshold=np.nextafter(best.score, 2.0)) == []
  router.add('extra', UNRELATED[0])  # embedded lazily on the next route
  assert router.route(UNRELATED[0], threshold=0.999)[0].key == 'extra'


def test_embedding_router_round_trips(tiny_model, tmp_path):
  router = route.EmbeddingRouter(tiny_model, threshold=0.5, **TINY)
  router.add_many(SHORT.items())
  router.save(tmp_path / 'emb.json')
  loaded = route.EmbeddingRouter.load(tmp_path / 'emb.json', tiny_model, encode=_byte_ids)
  assert loaded.entries == router.entries and loaded.threshold == 0.5
  assert loaded.matrix.tobytes() == router.matrix.tobytes()
  other = gemma_model.tiny(seed=1)  # another model: its own embeddings, recomputed
  rebuilt = route.EmbeddingRouter.load(tmp_path / 'emb.json', other, encode=_byte_ids)
  assert rebuilt.matrix.shape == router.matrix.shape
  assert rebuilt.matrix.tobytes() != router.matrix.tobytes()
  np.save(tmp_path / 'emb.json.npy', router.matrix[::-1])
  with pytest.raises(route.RouterFileError, match='SHA-256'):
    route.EmbeddingRouter.load(tmp_path / 'emb.json', tiny_model, encode=_byte_ids)


def test_embedding_router_file_binds_each_key_to_its_row(tiny_model, tmp_path):
  """The SHA-256 covered the matrix alone: entries reordered in the JSON routed to wrong keys."""
  router = route.EmbeddingRouter(tiny_model, threshold=0.5, **TINY)
  router.add_many(SHORT.items())
  path = tmp_path / 'emb.json'
  router.save(path)
  _edit(path, lambda body: body['entries'].reverse())
  with pytest.raises(route.RouterFileError, match='SHA-256'):
    route.EmbeddingRouter.load(path, tiny_model, encode=_byte_ids)


def test_route_many_scores_each_query_with_its_own_row(tiny_model):
  """route_many scored every query with the last query's similarities; then, with one BLAS
  matmul over the batch, in other bits than route (a stored text at 0.9999999)."""
  router = route.EmbeddingRouter(tiny_model, threshold=-math.inf, **TINY)
  router.add_many(SHORT.items())
  queries = [*SHORT.values(), UNRELATED[0][:48]]
  together = router.route_many(queries, k=2)
  for query, hits in zip(queries, together):
    assert hits == router.route(query, k=2)  # keys, and scores bit for bit
  for (key, _), hits in zip(SHORT.items(), together):
    assert hits[0].key == key and hits[0].score == 1.0


class _Fixed(route.Router):
  """Ranks by a table: query -> [(entry index, score)]."""

  kind = 'fixed'

  def __init__(self, table):
    super().__init__(threshold=0.0)
    self.table = table

  def _rank_many(self, queries):
    return [iter(self.table.get(q, ())) for q in queries]


# Top-1 hit, true key: q1 a 0.9 (a), q2 b 0.8 (b), q3 a 0.7 (c), q4 c 0.6 (abstain),
# q5 b 0.3 (b), q6 none (abstain).
LABELLED = [('q1', 'a'), ('q2', 'b'), ('q3', 'c'), ('q4', None), ('q5', 'b'), ('q6', None)]


def _fixed():
  router = _Fixed({'q1': [(0, 0.9)], 'q2': [(1, 0.8)], 'q3': [(0, 0.7)], 'q4': [(2, 0.6)]})
  router.table['q5'] = [(1, 0.3), (0, 0.2)]
  router.add_many([('a', 'text a'), ('b', 'text b'), ('c', 'text c')])
  return router


def test_evaluate_by_hand():
  e = route.evaluate(_fixed(), LABELLED, 0.5)
  # At 0.5: q1..q4 hit. Correct q1, q2 of 4 with a key; wrong q3, q4 of 6;
  # q4 of the 2 that should abstain; q5, q6 abstain.
  assert e.accuracy == stats.rate(2, 4)
  assert e.false_hit == stats.rate(2, 6)
  assert e.false_hit_abstain == stats.rate(1, 2)
  assert e.abstain == stats.rate(2, 6)
  body = e.to_json()
  assert body['threshold'] == 0.5 and body['accuracy']['rate'] == 0.5
  low = route.evaluate(_fixed(), LABELLED, 0.0)
  assert (low.accuracy.successes, low.false_hit.successes, low.abstain.successes) == (3, 2, 1)
  none = route.evaluate(_fixed(), [('q6', None)], 0.0)
  assert none.accuracy is None and none.false_hit_abstain == stats.rate(0, 1)


def test_sweep_by_hand():
  # Threshold: accuracy, false hits of 6, false hits among the 2 that abstain
  # 0.3: 3/4, 2, 1   0.6: 2/4, 2, 1   0.7: 2/4, 1, 0   0.8: 2/4, 0, 0
  # 0.9: 1/4, 0, 0   inf: 0/4, 0, 0
  best, curve = route.sweep(_fixed(), LABELLED, max_false_hit=0.2)
  assert [e.threshold for e in curve] == [0.3, 0.6, 0.7, 0.8, 0.9, math.inf]
  assert best.threshold == 0.8  # ties 0.7 on accuracy with fewer false hits
  assert best.accuracy == stats.rate(2, 4) and best.false_hit == stats.rate(0, 6)
  best, _ = route.sweep(_fixed(), LABELLED, max_false_hit=0.35)
  assert best.threshold == 0.3 and best.accuracy == stats.rate(3, 4)
  best, _ = route.sweep(_fixed(), LABELLED, max_false_hit=0.0, abstain_only=True)
  assert best.threshold == 0.8  # ties 0.7 on both: the higher threshold
  assert curve[-1].to_json()['threshold'] == 'inf'
  with pytest.raises(ValueError, match='no threshold'):  # 0/6 has a Wilson upper limit of 0.39
    route.sweep(_fixed(), LABELLED, max_false_hit=0.2, conservative=True)


def _rewritten(path, extra=b'', **fields):
  """The router file at `path` with `fields` changed and its SHA-256 recomputed (a file
  another tool wrote, consistent with its digest)."""
  body = json.loads(path.read_text())
  body.pop('sha256')
  route._write_json(path, {**body, **fields}, extra)


@pytest.mark.parametrize(
  'fields, match',
  [
    ({'threshold': 'high'}, "threshold must be a number.*got 'high'"),
    ({'threshold': float('nan')}, 'threshold must be a number .not NaN.*got nan'),
    ({'threshold': True}, 'threshold must be a number'),
    ({'b': -0.5}, r'b must be a number in \[0, 1\], got -0.5'),
    ({'b': 1.5}, r'b must be a number in \[0, 1\]'),
    ({'k1': '1.5'}, "k1 must be a finite number >= 0, got '1.5'"),
    ({'k1': float('inf')}, 'k1 must be a finite number'),
  ],
)
def test_a_bm25_file_with_a_setting_out_of_range_is_refused(tmp_path, fields, match):
  """A file consistent with its digest loaded whatever its settings said (a string threshold
  failed later, at the first route)."""
  path = tmp_path / 'bm25.json'
  _bm25().save(path)
  _rewritten(path, **fields)
  with pytest.raises(route.RouterFileError, match=f'bm25.json: {match}'):
    route.BM25Router.load(path)


def test_router_settings_are_checked_when_made():
  with pytest.raises(ValueError, match='b must be'):
    route.BM25Router(b=-0.1)
  with pytest.raises(ValueError, match='threshold must be'):
    route.ExactRouter(threshold=float('nan'))
  assert route.BM25Router(threshold=-math.inf).threshold == -math.inf  # keeps every hit
  assert route.BM25Router(threshold=np.float32(0.5), k1=np.float64(1.2)).k1 == 1.2  # numpy's
  assert route.BM25Router(threshold=math.inf).threshold == math.inf  # abstains always


@pytest.mark.parametrize(
  'fields, match',
  [
    ({'chunk_size': 0}, 'chunk_size must be an integer >= 1, got 0'),
    ({'batch_size': 2.0}, 'batch_size must be an integer >= 1, got 2.0'),
    ({'fingerprint': 7}, 'fingerprint must be a string, got 7'),
    ({'threshold': None}, None),  # not fitted yet: loads
  ],
)
def test_an_embedding_file_with_a_setting_out_of_range_is_refused(
  tiny_model, tmp_path, fields, match
):
  router = route.EmbeddingRouter(tiny_model, threshold=0.5, **TINY)
  router.add_many(SHORT.items())
  path = tmp_path / 'emb.json'
  router.save(path)
  _rewritten(path, route._matrix_bytes(router.matrix), **fields)
  if match is None:
    assert route.EmbeddingRouter.load(path, tiny_model, encode=_byte_ids).threshold is None
    return
  with pytest.raises(route.RouterFileError, match=f'emb.json: {match}'):
    route.EmbeddingRouter.load(path, tiny_model, encode=_byte_ids)
