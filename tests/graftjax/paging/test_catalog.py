"""Catalog: sqlite entries beside the store, routed by the flywheel's routers."""

import pytest

from graftjax import store as store_lib
from graftjax.flywheel import route as route_lib
from graftjax.paging import catalog as catalog_lib

FP = 'f' * 64
TEXTS = {
  'a' * 64: 'the json decoder scans strings and numbers',
  'b' * 64: 'a heap queue keeps the smallest item first',
  'c' * 64: 'the tar archive reader walks member headers',
}


def _fill(catalog):
  for i, (key, text) in enumerate(TEXTS.items()):
    catalog.add(
      key,
      text,
      source=f'file{i}.py',
      n_tokens=10 + i,
      model_fingerprint=FP,
      dtype='bfloat16',
      page_layout=((0, 10), (3, 10)) if i == 0 else None,
    )


def test_route_returns_catalogued_entries(tmp_path):
  with catalog_lib.Catalog(tmp_path / 'c.sqlite') as catalog:
    _fill(catalog)
    (entry, score), *_ = catalog.route('how does the json decoder scan strings', k=2)
    assert entry.key == 'a' * 64 and entry.source == 'file0.py' and score > 0
    assert entry.page_layout == ((0, 10), (3, 10))
    assert len(catalog) == 3


def test_catalog_persists_and_reopens_with_its_router(tmp_path):
  store = store_lib.BlockStore(tmp_path / 'store')
  with catalog_lib.Catalog.beside(store) as catalog:
    _fill(catalog)
  assert store.list() == []  # the store does not see the catalog file
  with catalog_lib.Catalog.beside(store, router=route_lib.ExactRouter()) as catalog:
    assert catalog.keys() == sorted(TEXTS)
    hits = catalog.route('A heap queue keeps the smallest item first.')
    assert [e.key for e, _ in hits] == ['b' * 64]
    assert catalog.get('c' * 64).n_tokens == 12


def test_same_entry_twice_is_a_no_op_and_a_conflict_is_refused(tmp_path):
  with catalog_lib.Catalog(':memory:') as catalog:
    _fill(catalog)
    key, text = next(iter(TEXTS.items()))
    layout = ((0, 10), (3, 10))
    assert not catalog.add(
      key,
      text,
      source='file0.py',
      n_tokens=10,
      model_fingerprint=FP,
      dtype='bfloat16',
      page_layout=layout,
    )
    with pytest.raises(catalog_lib.CatalogError, match='other values'):
      catalog.add(
        key, text, source='elsewhere.py', n_tokens=10, model_fingerprint=FP, dtype='bfloat16'
      )
    assert len(catalog) == 3 and len(catalog.router) == 3
    with pytest.raises(catalog_lib.CatalogError, match='not catalogued'):
      catalog.get('d' * 64)


@pytest.mark.parametrize('text, n_tokens', [('...', 5), ('a real text', 0)])
def test_a_refused_entry_leaves_the_catalog_openable(tmp_path, text, n_tokens):
  """Rows used to be committed before the router refused the text: the catalog never reopened."""
  path = tmp_path / 'c.sqlite'
  with catalog_lib.Catalog(path) as catalog:
    with pytest.raises(catalog_lib.CatalogError):
      catalog.add(
        'd' * 64, text, source='x', n_tokens=n_tokens, model_fingerprint=FP, dtype='float32'
      )
    assert len(catalog) == 0
  with catalog_lib.Catalog(path) as reopened:
    assert len(reopened) == 0
