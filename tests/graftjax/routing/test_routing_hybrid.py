"""The hybrid router: BM25 units mixed with the model's own embedding, reranked by the model."""

import json

import numpy as np
import pytest
from graftjax.models.gemma import model as gemma_model

from graftjax.paging import catalog as catalog_lib
from graftjax.routing import route as route_lib
from graftjax.routing import units as units_lib


def _byte_ids(text: str) -> list[int]:
  """A tokenizer for the tiny model (vocabulary 256; ids 0-2 are pad, eos, bos)."""
  return [3 + b % 253 for b in text.encode()]


EMBED = {'chunk_size': 8, 'batch_size': 2, 'encode': _byte_ids}
TINY = {'unit_words': 16, **EMBED}
# The fact page holds the reworded question's words in other forms (BM25 matches its names
# only); the distractor holds every word of the question but says something else.
PAGES = [
  ('fact', 'Which lockers belonged to Bartholomew Quarshie?'),
  ('other', 'Bartholomew Quarshie belongs to the locker club.'),
  ('noise', 'Lorem ipsum dolor sit amet consectetur.'),
]
QUERY = 'Which locker belongs to Bartholomew Quarshie?'


def _router(model, **kwargs) -> units_lib.HybridRouter:
  router = units_lib.HybridRouter(model, **{'threshold': -np.inf, **TINY, **kwargs})
  router.add_many(PAGES)
  return router


def test_bm25_misses_a_reworded_query_that_the_embedding_mix_routes(tiny_model):
  lexical = units_lib.UnitRouter(threshold=-np.inf, unit_words=16)
  lexical.add_many(PAGES)
  assert [h.key for h in lexical.route(QUERY, 2)] == ['other', 'fact']
  assert _router(tiny_model, weight=1.0).route(QUERY) == lexical.route(QUERY)  # BM25 alone
  (hit,) = _router(tiny_model, weight=0.3).route(QUERY)
  assert hit.key == 'fact'
  query, fact = route_lib.embed_texts(tiny_model, [QUERY, PAGES[0][1]], **EMBED)
  bm25 = lexical.route(QUERY, 2)[1].score
  assert hit.score == pytest.approx(0.3 * bm25 + 0.7 * float(query @ fact), abs=1e-6)


def test_query_gain_is_the_log_likelihood_gain_of_the_query(tiny_model):
  context, query = 'Amelia has locker 17.', 'Which locker?'
  (gain,) = units_lib.query_gain(tiny_model, query, [context], chunk_size=8, encode=_byte_ids)

  def log_likelihood(prefix: list[int]) -> float:
    ids = [tiny_model.config.bos_id, *prefix, *_byte_ids(query)]
    tokens = np.asarray([ids], np.int32)
    positions = np.arange(len(ids), dtype=np.int32)[None]
    logits, _ = tiny_model.forward(
      tokens, positions, tiny_model.init_cache(capacity=64), logits='all'
    )
    logits = np.asarray(logits[0], np.float64)
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    n = len(query.encode())
    return float(np.mean([logp[len(ids) - n - 1 + j, ids[len(ids) - n + j]] for j in range(n)]))

  expected = log_likelihood([*_byte_ids(context), *_byte_ids('\n')]) - log_likelihood([])
  assert gain == pytest.approx(expected, abs=1e-4)


def test_uniform_weights_give_the_mean_and_one_token_weighted_gives_its_gain(tiny_model):
  context, query = 'Amelia has locker 17.', 'Which locker?'
  gain = lambda weigh: units_lib.query_gain(
    tiny_model, query, [context], chunk_size=8, encode=_byte_ids, weigh=weigh
  )[0]
  n = len(_byte_ids(query))
  assert gain(lambda ids: np.ones(len(ids))) == pytest.approx(gain(None), abs=1e-12)
  per_token = [gain(lambda ids, j=j: np.eye(len(ids))[j]) for j in range(n)]
  assert np.mean(per_token) == pytest.approx(gain(None), abs=1e-12)
  assert len(set(per_token)) > 1  # the tokens' gains differ, so weights matter
  for wrong in (lambda ids: np.zeros(len(ids)), lambda ids: -np.ones(len(ids)), lambda ids: [1]):
    with pytest.raises(ValueError, match=f'weigh must give {n} weights >= 0'):
      gain(wrong)


def test_token_idf_counts_the_units_holding_each_token_and_follows_added_pages(tiny_model):
  router = _router(tiny_model)
  units = [set(_byte_ids(unit)) for _, unit in router.entries]
  common, rare, absent = _byte_ids('e')[0], _byte_ids('B')[0], _byte_ids('#')[0]
  assert [sum(t in u for u in units) for t in (common, rare, absent)] == [3, 2, 0]
  idf = lambda df, n: np.log1p((n - df + 0.5) / (df + 0.5))
  np.testing.assert_array_equal(
    router.token_idf([common, rare, absent]), [idf(3, 3), idf(2, 3), idf(0, 3)]
  )
  router.add('hash', 'Only # now')
  np.testing.assert_array_equal(router.token_idf([absent, common]), [idf(1, 4), idf(3, 4)])


@pytest.mark.parametrize('weighting', ['idf', 'mean'])
def test_rerank_orders_the_best_pages_by_query_gain(tiny_model, weighting):
  router = _router(tiny_model, weight=1.0, rerank=2, rerank_weighting=weighting, rerank_names=False)
  hits = router.route(QUERY, k=3)
  assert len(hits) == 2 and {h.key for h in hits} == {'other', 'fact'}  # the rerank best two
  gains = units_lib.query_gain(
    tiny_model,
    QUERY,
    [PAGES[0][1], PAGES[1][1]],
    chunk_size=8,
    encode=_byte_ids,
    weigh=router.token_idf if weighting == 'idf' else None,
  )
  by_key = {'fact': gains[0], 'other': gains[1]}
  assert [h.score for h in hits] == sorted(by_key.values(), reverse=True)
  assert all(h.score == pytest.approx(by_key[h.key]) for h in hits)
  assert router.route(QUERY, k=3, threshold=max(gains) + 1e-9) == []


def test_a_catalog_routes_its_pages_with_the_hybrid_router(tiny_model):
  with catalog_lib.Catalog(':memory:', router=_router(tiny_model, weight=0.3)) as catalog:
    for key, text in PAGES:
      catalog.add(
        key,
        text,
        source=f'{key}.txt',
        n_tokens=len(text),
        model_fingerprint=tiny_model.fingerprint,
        dtype='float32',
        token_ids=_byte_ids(text),
      )
    ((entry, _),) = catalog.route(QUERY, k=1)
    assert entry.key == 'fact' and entry.source == 'fact.txt'
    assert entry.tokens_sha256 == catalog_lib.tokens_sha256(_byte_ids(PAGES[0][1]))


@pytest.mark.parametrize('weight, rows', [(0.3, 3), (1.0, 0)])
def test_saved_router_routes_the_same(tiny_model, tmp_path, weight, rows):
  router = _router(tiny_model, weight=weight, rerank=2, threshold=-0.5)
  path = tmp_path / 'hybrid.json'
  router.save(path)
  assert np.load(f'{path}.npy').shape == (rows, tiny_model.config.embed_dim)
  loaded = units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids)
  assert loaded.entries == router.entries and loaded.threshold == -0.5
  assert (loaded.weight, loaded.rerank, loaded.lexical.unit_words) == (weight, 2, 16)
  assert loaded.route(QUERY, 2) == router.route(QUERY, 2)
  other = units_lib.HybridRouter.load(path, gemma_model.tiny(seed=1), encode=_byte_ids)
  assert other.entries == router.entries  # another model: its own embeddings, recomputed
  with pytest.raises(route_lib.RouterFileError, match="not 'bm25-units'"):
    units_lib.UnitRouter.load(path)


def _edit(path, change):
  body = json.loads(path.read_text())
  change(body)
  path.write_text(json.dumps(body))


@pytest.mark.parametrize(
  'change, match',
  [
    (lambda body: body['entries'].reverse(), 'SHA-256'),  # keys paired with other units
    (lambda body: body['entries'][0].__setitem__(0, 'noise'), 'SHA-256'),
    (lambda body: body.__setitem__('weight', 1.0), 'SHA-256'),
    (lambda body: body.__setitem__('rerank', 0), 'SHA-256'),
    (lambda body: body.__setitem__('rerank_weighting', 'mean'), 'SHA-256'),
    (lambda body: body.pop('sha256'), 'no sha256'),
  ],
)
def test_a_tampered_router_file_is_refused(tiny_model, tmp_path, change, match):
  path = tmp_path / 'hybrid.json'
  _router(tiny_model, weight=0.3, rerank=2).save(path)
  _edit(path, change)
  with pytest.raises(route_lib.RouterFileError, match=match):
    units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids)


def test_tampered_embeddings_are_refused(tiny_model, tmp_path):
  path = tmp_path / 'hybrid.json'
  router = _router(tiny_model, weight=0.3)
  router.save(path)
  np.save(f'{path}.npy', router.dense.matrix[::-1])
  with pytest.raises(route_lib.RouterFileError, match='SHA-256'):
    units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids)
  (tmp_path / 'hybrid.json.npy').unlink()
  with pytest.raises(route_lib.RouterFileError, match='cannot read the embeddings'):
    units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids)


def test_settings_are_checked(tiny_model):
  with pytest.raises(ValueError, match='weight'):
    units_lib.HybridRouter(tiny_model, threshold=0.0, weight=1.5)
  with pytest.raises(ValueError, match='rerank'):
    units_lib.HybridRouter(tiny_model, threshold=0.0, rerank=-1)


def test_a_query_no_unit_matches_reranks_nothing(tiny_model):
  router = _router(tiny_model, weight=1.0, rerank=2)
  assert router.route('zzz qqq', k=2) == []


def _rewritten(path, extra, **fields):
  """The router file with `fields` changed and its SHA-256 recomputed over them and `extra`."""
  body = json.loads(path.read_text())
  body.pop('sha256')
  route_lib._write_json(path, {**body, **fields}, extra)


@pytest.mark.parametrize(
  'fields, match',
  [
    ({'weight': 1.5}, r'weight must be a number in \[0, 1\], got 1.5'),
    ({'weight': 'half'}, 'weight must be a number'),
    ({'rerank': -1}, 'rerank must be an integer >= 0, got -1'),
    ({'unit_words': 0}, 'unit_words must be an integer >= 1, got 0'),
    ({'stride_words': 17}, 'stride_words must be at most unit_words 16, got 17'),
    ({'k1': -1.0}, 'k1 must be a finite number >= 0'),
    ({'threshold': float('nan')}, 'threshold must be a number .not NaN.'),
  ],
)
def test_a_hybrid_file_with_a_setting_out_of_range_is_refused(tiny_model, tmp_path, fields, match):
  """A file consistent with its digest was loaded with any settings (or failed with a bare
  ValueError of the constructor)."""
  path = tmp_path / 'hybrid.json'
  router = _router(tiny_model, weight=0.3)
  router.save(path)
  _rewritten(path, route_lib._matrix_bytes(router.dense.matrix), **fields)
  with pytest.raises(route_lib.RouterFileError, match=f'hybrid.json: {match}'):
    units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids)


@pytest.mark.parametrize(
  'fields, match',
  [
    ({'stride_words': 0}, 'stride_words must be an integer >= 1, got 0'),
    ({'unit_words': '16'}, "unit_words must be an integer >= 1, got '16'"),
    ({'b': -0.25}, r'b must be a number in \[0, 1\], got -0.25'),
  ],
)
def test_a_unit_router_file_with_a_setting_out_of_range_is_refused(tmp_path, fields, match):
  path = tmp_path / 'units.json'
  router = units_lib.UnitRouter(threshold=0.0, unit_words=16)
  router.add_many(PAGES)
  router.save(path)
  _rewritten(path, b'', **fields)
  with pytest.raises(route_lib.RouterFileError, match=f'units.json: {match}'):
    units_lib.UnitRouter.load(path)


# A mixed-size store: one long page holds the fact among filler words; short notes repeat the
# reworded question's words and the last name (every other one the first name too), so BM25
# ranks them first. Each note has a word of its own (no copies: the rerank takes one of those).
FACT = 'The locker of Bartholomew Quarshie has number 4821.'
FILLER = ' '.join(f'word{i}' for i in range(40))
MIXED = [
  ('long/fact', f'{FILLER} {FACT} {FILLER}'),
  ('long/other', f'{FILLER} The access code of Amelia Abernathy is 1234. {FILLER}'),
  *[
    (
      f'short/{j}',
      f'Which locker belongs to Quarshie? See the locker list{j}.' + ' Bartholomew.' * (j % 2),
    )
    for j in range(12)
  ],
]


def _knows_the_fact(model, query, contexts, **kwargs):
  """A reranker that reads the fact: gain 1 for a context holding its number, else 0."""
  del model, query, kwargs
  return np.asarray([float('4821' in c) for c in contexts])


@pytest.mark.parametrize('rerank, found', [(4, False), (16, True)])
def test_a_wider_rerank_recovers_a_page_outside_the_lexical_top_4(
  tiny_model, monkeypatch, rerank, found
):
  """The rerank reorders its candidates only: the fact's page, ranked below 4 short notes by
  BM25, is reached when it is among the `rerank` pages reranked and never otherwise."""
  lexical = units_lib.UnitRouter(threshold=-np.inf, unit_words=16)
  lexical.add_many(MIXED)
  ranked = [h.key for h in lexical.route(QUERY, 16)]
  assert 'long/fact' in ranked and ranked.index('long/fact') >= 4  # outside the top 4
  monkeypatch.setattr(units_lib, 'query_gain', _knows_the_fact)
  router = units_lib.HybridRouter(tiny_model, threshold=-np.inf, rerank=rerank, **TINY)
  router.add_many(MIXED)
  hits = router.route(QUERY, k=4)
  assert len(hits) == 4
  assert (hits[0].key == 'long/fact') is found
  assert ('long/fact' in [h.key for h in hits]) is found


# A question sharing only the name with its fact, whose other words 24 notes repeat (twice),
# among names shared with other people: BM25 ranks the fact's page below every note, out of a
# rerank of 16 by the query; the names are the query's rare words, and only the fact holds both.
GAME = 'How well did Bartholomew Quarshie do in the last game?'
CROWDED = [
  ('long/fact', f'{FILLER} Bartholomew Quarshie scored 4821 points in the final. {FILLER}'),
  *[
    (f'long/q{i}', f'{first} Quarshie scored {1000 + i} points.')
    for i, first in enumerate(['Amelia', 'Dorian', 'Jasper', 'Xavier'])
  ],
  *[
    (f'long/b{i}', f'Bartholomew {last} scored {2000 + i} points.')
    for i, last in enumerate(['Abernathy', 'Vasquez', 'Yamamoto', 'Zielinski'])
  ],
  *[
    (f'note/{j:02}', f'How well did the team do in the last game? The last game was close{j}.')
    for j in range(24)
  ],
  *[(f'pad/{i:03}', f'pad{i} text{i % 7} more{i % 11}') for i in range(200)],
]


def test_rare_words_are_the_query_words_of_high_idf():
  lexical = units_lib.UnitRouter(threshold=-np.inf, unit_words=16)
  assert lexical.rare_words(GAME) == []  # nothing stored
  lexical.add_many(CROWDED)
  assert lexical.rare_words(GAME) == ['bartholomew', 'quarshie']  # not 'game', 'last', 'well'
  assert lexical.rare_words('zzz qqq') == []


@pytest.mark.parametrize('rerank, rerank_rare, found', [(16, 0, False), (4, 2, True), (0, 1, True)])
def test_candidates_by_the_rare_words_recover_a_page_no_query_rerank_reaches(
  tiny_model, monkeypatch, rerank, rerank_rare, found
):
  lexical = units_lib.UnitRouter(threshold=-np.inf, unit_words=16)
  lexical.add_many(CROWDED)
  assert [h.key for h in lexical.route(GAME, 64)].index('long/fact') >= 16
  monkeypatch.setattr(units_lib, 'query_gain', _knows_the_fact)
  router = units_lib.HybridRouter(
    tiny_model, threshold=-np.inf, rerank=rerank, rerank_rare=rerank_rare, **TINY
  )
  router.add_many(CROWDED)
  hits = router.route(GAME, k=32)
  assert len(hits) <= rerank + rerank_rare
  assert (hits[0].key == 'long/fact') is found


def test_rerank_rare_is_saved_checked_and_absent_from_older_files(tiny_model, tmp_path):
  path = tmp_path / 'hybrid.json'
  _router(tiny_model, rerank=2, rerank_rare=3).save(path)
  assert units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids).rerank_rare == 3
  empty = np.zeros((0, tiny_model.config.embed_dim), np.float32)  # no embeddings at weight 1
  empty = route_lib._matrix_bytes(empty)
  _rewritten(path, empty, rerank_rare=-1)
  with pytest.raises(route_lib.RouterFileError, match='rerank_rare must be an integer >= 0'):
    units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids)
  body = json.loads(path.read_text())
  del body['rerank_rare'], body['sha256']
  route_lib._write_json(path, body, empty)
  assert units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids).rerank_rare == 0
  with pytest.raises(ValueError, match='rerank_rare must be an integer >= 0, got True'):
    units_lib.HybridRouter(tiny_model, threshold=0.0, rerank_rare=True)


def test_rerank_weighting_is_saved_checked_and_mean_in_older_files(tiny_model, tmp_path):
  path = tmp_path / 'hybrid.json'
  _router(tiny_model, rerank=2).save(path)
  assert units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids).rerank_weighting == 'idf'
  empty = route_lib._matrix_bytes(np.zeros((0, tiny_model.config.embed_dim), np.float32))
  _rewritten(path, empty, rerank_weighting='tf')
  with pytest.raises(route_lib.RouterFileError, match='rerank_weighting must be one of'):
    units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids)
  body = json.loads(path.read_text())
  del body['rerank_weighting'], body['sha256']
  route_lib._write_json(path, body, empty)
  loaded = units_lib.HybridRouter.load(path, tiny_model, encode=_byte_ids)
  assert loaded.rerank_weighting == 'mean'  # what a rerank did before the setting
  with pytest.raises(ValueError, match="rerank_weighting must be one of .* got 'IDF'"):
    units_lib.HybridRouter(tiny_model, threshold=0.0, rerank_weighting='IDF')


def test_the_candidates_and_their_order_do_not_depend_on_the_order_pages_were_added(
  tiny_model, monkeypatch
):
  """A catalog adds its pages in key order when reopened: the same candidates, in the same
  order (ties of the rerank's gains fall to it), whatever the order they were added in."""
  seen = []

  def record(model, query, contexts, **kwargs):
    seen.append(list(contexts))
    return _knows_the_fact(model, query, contexts, **kwargs)

  monkeypatch.setattr(units_lib, 'query_gain', record)
  routed = []
  for entries in (CROWDED, sorted(CROWDED), CROWDED[::-1]):
    router = units_lib.HybridRouter(tiny_model, threshold=-np.inf, rerank=4, rerank_rare=4, **TINY)
    router.add_many(entries)
    routed.append(router.route(GAME, k=8))
  assert routed[0] == routed[1] == routed[2] and routed[0][0].key == 'long/fact'
  assert seen[0] == seen[1] == seen[2] and len(seen[0]) == 8
