"""Routing units: pages of mixed sizes routed without favouring the short ones."""

import numpy as np
import pytest

from graftjax.paging import catalog as catalog_lib
from graftjax.routing import route as route_lib
from graftjax.routing import units as units_lib
from graftjax.studies.paging import bench_paging_recall


def _filler(count: int, seed: int = 0) -> list[str]:
  rng = np.random.default_rng(seed)
  words = [f'w{i}' for i in range(400)]
  return ['\n'.join(' '.join(rng.choice(words, 12)) for _ in range(25)) for _ in range(count)]


def test_units_cover_every_word_and_every_short_run():
  text = ' '.join(f'x{i}' for i in range(50))
  got = units_lib.units(text, 16, 8)
  assert got[0].split()[0] == 'x0' and got[-1].split()[-1] == 'x49'
  assert all(len(u.split()) == 16 for u in got)
  for a in range(50 - 8):
    run = ' '.join(f'x{i}' for i in range(a, a + 9))
    assert any(run in u for u in got), a
  assert units_lib.units('a b c', 16, 8) == ['a b c']
  with pytest.raises(ValueError, match='stride_words'):
    units_lib.units(text, 8, 9)
  with pytest.raises(ValueError, match='stride_words'):
    units_lib.UnitRouter(threshold=0.0, unit_words=8, stride_words=0)


def test_short_pages_fool_bm25_but_not_routing_units():
  entries, questions = bench_paging_recall.mixed_store(
    _filler(8), facts=8, absent=0, short_pages=40, seed=0
  )
  bm25 = route_lib.BM25Router(threshold=0.0)
  units = units_lib.UnitRouter(threshold=0.0)
  for router in (bm25, units):
    router.add_many(entries)
  asks = [q.direct for q in questions]
  by_bm25 = [hits[0].key for hits in bm25.route_many(asks, 1)]
  by_units = [hits[0].key for hits in units.route_many(asks, 1)]
  assert any(key.startswith('short/') for key in by_bm25), by_bm25
  assert by_units == [q.key for q in questions]


def test_a_question_about_what_is_not_stored_scores_low():
  router = units_lib.UnitRouter(threshold=0.0)
  router.add_many(
    [('a', 'The access code of Amelia Blackwood is 4821.'), ('b', 'Lorem ipsum dolor sit amet.')]
  )
  (every_word,) = router.route('access code Amelia Blackwood')
  (stored,) = router.route('What is the access code of Amelia Blackwood?')
  (absent,) = router.route('What is the access code of Zebulon Quarshie?')
  assert every_word.key == stored.key == absent.key == 'a'
  assert every_word.score == pytest.approx(1.0) and stored.score < 1.0  # 'what' is in no unit
  assert absent.score < 0.6 * stored.score
  assert router.route('What is the access code of Zebulon Quarshie?', threshold=0.6) == []


def test_saved_router_routes_the_same(tmp_path):
  entries, questions = bench_paging_recall.mixed_store(
    _filler(4), facts=4, absent=0, short_pages=6, seed=1
  )
  router = units_lib.UnitRouter(threshold=0.0, unit_words=32, stride_words=8)
  router.add_many(entries)
  router.save(tmp_path / 'router.json')
  loaded = units_lib.UnitRouter.load(tmp_path / 'router.json')
  assert (loaded.unit_words, loaded.stride_words) == (32, 8)
  asks = [q.reworded for q in questions]
  assert loaded.route_many(asks, 2) == router.route_many(asks, 2)
  with pytest.raises(route_lib.RouterFileError, match='bm25-units'):
    route_lib.BM25Router.load(tmp_path / 'router.json')


def test_a_catalog_routes_its_pages_by_units():
  entries, questions = bench_paging_recall.mixed_store(
    _filler(8), facts=8, absent=0, short_pages=40, seed=0
  )
  with catalog_lib.Catalog(':memory:', router=units_lib.UnitRouter(threshold=0.0)) as catalog:
    for key, text in entries:
      catalog.add(
        key,
        text,
        source=key,
        n_tokens=len(text.split()),
        model_fingerprint='0' * 64,
        dtype='float32',
        token_ids=[len(key)],
      )
    for q in questions:
      ((entry, _),) = catalog.route(q.direct, k=1)
      assert entry.key == q.key and entry.source == q.key


def test_routing_rows_report_top_k_and_false_hits():
  entries, questions = bench_paging_recall.mixed_store(
    _filler(6), facts=6, absent=4, short_pages=10, seed=3
  )
  rows = bench_paging_recall.routing_rows(
    entries, questions, router=units_lib.UnitRouter(threshold=0.0), thresholds=[0.0, 2.0]
  )
  for wording in ('direct', 'reworded'):
    r = rows[wording]
    assert r['questions'] == 6 and r['top1']['successes'] <= r['top4']['successes']
    at0, at2 = r['by_threshold']
    assert at0['false_hits']['trials'] == 4 and at2['false_hits']['successes'] == 0


def _catalogue(catalog, entries):
  for key, text in entries:
    catalog.add(
      key,
      text,
      source=key,
      n_tokens=len(text.split()),
      model_fingerprint='0' * 64,
      dtype='float32',
      token_ids=[len(key)],
    )


@pytest.mark.parametrize(
  'router',
  [
    lambda: route_lib.BM25Router(threshold=0.0),
    lambda: units_lib.UnitRouter(threshold=0.0, unit_words=16, stride_words=8),
  ],
)
def test_a_reopened_catalog_ranks_its_pages_as_built(tmp_path, router):
  """Built, a catalog's router held its pages in insertion order; reopened, in key order: tied
  pages swapped, and BM25's term ids (so its sums) changed, between the two."""
  entries, questions = bench_paging_recall.mixed_store(
    _filler(6), facts=6, absent=2, short_pages=12, seed=2
  )
  entries = entries[::-1]  # not in key order
  asks = [text for q in questions for text in (q.direct, q.reworded)]
  path = tmp_path / 'catalog.sqlite'

  def ranked(catalog):
    return [[(e.key, s.hex()) for e, s in catalog.route(q, k=8)] for q in asks]

  with catalog_lib.Catalog(path, router=router()) as catalog:
    _catalogue(catalog, entries)
    built = ranked(catalog)
  with catalog_lib.Catalog(path, router=router()) as catalog:
    assert ranked(catalog) == built
  assert any(len({s for _, s in hits}) < len(hits) for hits in built)  # ties were ranked
