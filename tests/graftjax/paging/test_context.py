"""The paged attention context: routed pages installed as segments are byte-equal to a fresh
block-attention prefill of their texts, bad pages are refused before any cache is built, and the
host-memory tier is a bounded LRU of verified pages.

Tiny model (6 layers, window 8), float32, rope_relative, Pallas kernels (the interpreter on CPU);
one capacity and chunk size throughout, texts padded to whole chunks, so programs compile once.
"""

import dataclasses
import hashlib
import os

import numpy as np
import pytest
from graftjax.models.gemma import model as gemma_model

from graftjax import blocks
from graftjax import compose
from graftjax import store as store_lib
from graftjax.paging import catalog as catalog_lib
from graftjax.paging import context as context_lib
from graftjax.paging import pages

CAPACITY, CHUNK, WINDOW = 1024, 8, 8
TEXTS = {
  'river': 'the lantern by the river mill turns slowly at dusk',
  'stone': 'a lantern of stone guards the northern gate and its keeper',
  'orchard': 'apples in the orchard ripen under a lantern moon',
  'harbor': 'the harbor bell rings twice when fog rolls in',
}
QUERY = 'which lantern river stone orchard'


def _padded(text: str) -> str:
  while (len(text.encode()) + 1) % CHUNK:  # BOS + bytes: whole chunks
    text += '.'
  return text


def ids_of(text: str, *, bos: bool = True) -> list[int]:
  return ([2] if bos else []) + list(text.encode())


QUERY_IDS = ids_of(QUERY, bos=False)
QUERY_IDS += [ord(' ')] * (-len(QUERY_IDS) % CHUNK)  # whole chunks


def digest(a) -> str:
  return hashlib.sha256(np.asarray(a).tobytes()).hexdigest()


@pytest.fixture(scope='module')
def model():
  return gemma_model.tiny().with_position_scheme('rope_relative').with_impl('pallas')


@pytest.fixture(scope='module')
def captured(model):
  """name -> (text, block): each text prefilled alone at slot 0 and captured."""
  out = {}
  for name, text in TEXTS.items():
    text = _padded(text)
    ids = ids_of(text)
    _, cache = model.prefill(
      ids, cache=model.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='none'
    )
    block = blocks.capture(
      cache, blocks.Span(0, len(ids)), token_ids=ids, target=model.graft_target, chunk_size=CHUNK
    )
    out[name] = (text, block)
  return out


class Library:
  """A store and catalog of the pages of `captured` but harbor (fresh per test that damages it)."""

  def __init__(self, model, captured, root):
    self.model = model
    self.store = store_lib.BlockStore(root)
    self.catalog = catalog_lib.Catalog(':memory:')
    self.keys = {}
    for name, (text, block) in captured.items():
      if name == 'harbor':  # left for the tests to add as they need
        continue
      self.keys[name] = self.add(name, text, pages.to_page(block, model.config))

  def add(self, name, text, page, **entry):
    key = pages.put(self.store, page)
    target = self.model.graft_target
    fields = {
      'source': name,
      'n_tokens': len(page.block),
      'model_fingerprint': target.fingerprint,
      'dtype': target.dtype,
      'page_layout': page.layout,
      'token_ids': page.block.meta.token_ids,
    }
    fields.update(entry)
    self.catalog.add(key, text, **fields)
    return key

  def page(self, key):
    return pages.get(self.store, key)

  def context(self, **kwargs):
    return context_lib.PagedContext(
      self.model, self.store, self.catalog, capacity=CAPACITY, **kwargs
    )


@pytest.fixture(scope='module')
def library(model, captured, tmp_path_factory):
  return Library(model, captured, tmp_path_factory.mktemp('context') / 'pages')


@pytest.fixture
def damaged(model, captured, tmp_path):
  return Library(model, captured, tmp_path / 'pages')


def paged_logits(ctx, opened):
  logits, _ = ctx.query(opened, QUERY_IDS, chunk_size=CHUNK, logits='all')
  return np.asarray(logits)


def fresh_logits(ctx, opened):
  cache = ctx.fresh(opened, chunk_size=CHUNK)
  logits, _ = ctx.model.prefill(
    QUERY_IDS,
    cache=cache,
    chunk_size=CHUNK,
    start_position=opened.layout.next_position,
    logits='all',
  )
  return np.asarray(logits)


def test_routed_pages_are_byte_equal_to_fresh_block_attention_prefill(library):
  tier = context_lib.HostTier(library.store, max_bytes=1 << 20)
  assert tier.memory == 'numpy'  # CPU: plain numpy
  ctx = library.context(tier=tier)
  opened = ctx.open(QUERY, k=3)
  assert set(opened.keys) == {library.keys[n] for n in ('river', 'stone', 'orchard')}
  assert [p.slot for p in opened.layout.placements] == [0, 256, 512]
  assert [p.segment for p in opened.layout.placements] == [1, 2, 3]
  # The pages really are trimmed: local layers keep W - 1 rows (compact blocks, no page
  # layout), the rest installed as zeros.
  assert all(e.page_layout is None for e in opened.entries)
  assert all(p.block.meta.tail_rows == WINDOW - 1 for p in map(library.page, opened.keys))
  first = opened.layout.placements[0]
  k = np.asarray(opened.cache.k)[0, 0, first.slot : first.stop]
  assert not k[: first.length - (WINDOW - 1)].any() and k[-(WINDOW - 1) :].any()
  assert opened.hits == 0 and set(opened.seconds) == {'route', 'read', 'check', 'install'}
  paged = paged_logits(ctx, opened)
  assert digest(paged) == digest(fresh_logits(ctx, opened))
  # Again from the host tier: every page a hit, the same bytes.
  again = ctx.open(QUERY, k=3)
  assert again.hits == 3 and tier.stats()['hits'] == 3 and tier.stats()['misses'] == 3
  assert digest(paged_logits(ctx, again)) == digest(paged)
  # The query sees every page: without the last one its logits change.
  two = ctx.assemble(list(opened.keys[:2]))
  assert not np.allclose(paged[0, -1], paged_logits(ctx, two)[0, -1])


def test_a_page_short_of_the_window_is_refused_where_the_query_sees_its_zeros(library, captured):
  """The failure case: one local row fewer than W - 1 changes the query's logits."""
  text, block = captured['harbor']
  short = library.add(
    'harbor-short', text, pages.to_page(block, library.model.config, local_rows=WINDOW - 2)
  )
  ctx = library.context()
  keys = [library.keys['river'], short]
  with pytest.raises(pages.PageError, match=r'harbor-short.*exact from position'):
    ctx.assemble(keys)
  # Installed anyway (past the check), the logits differ from the fresh prefill's.
  stored = [pages.get(library.store, key).block for key in keys]
  placed, layout = compose.place(library.model, stored, capacity=CAPACITY, keys=keys)
  # (graft checks the page too: told of a later first query, it installs it)
  cache = compose.install(
    library.model, placed, capacity=CAPACITY, query_position=layout.next_position + 1
  )
  bypass = context_lib.Context(
    cache, layout, (), None, tuple(b.meta.token_ids for b in stored), {}, 0
  )
  assert digest(paged_logits(ctx, bypass)) != digest(fresh_logits(ctx, bypass))
  # Before another page, the query sits far enough past it: accepted, and exact.
  earlier = ctx.assemble([short, library.keys['river']])
  assert digest(paged_logits(ctx, earlier)) == digest(fresh_logits(ctx, earlier))


@pytest.fixture
def no_install(monkeypatch):
  """Fails the test if any cache is built."""

  def refuse(*args, **kwargs):
    raise AssertionError('a cache was built from a context that should have been refused')

  monkeypatch.setattr(compose, 'install', refuse)


def _changed(block, **meta):
  return dataclasses.replace(block, meta=dataclasses.replace(block.meta, **meta))


def test_a_page_catalogued_for_another_model_is_refused_before_reading(
  damaged, captured, no_install
):
  text, block = captured['harbor']
  page = pages.to_page(_changed(block, model_fingerprint='0' * 64), damaged.model.config)
  other = damaged.add('harbor-other-model', text, page, model_fingerprint='0' * 64)
  with pytest.raises(
    context_lib.PagedContextError, match=r'page .*\(harbor-other-model\).*another model'
  ):
    damaged.context().assemble([damaged.keys['river'], other])


def test_a_page_of_another_model_is_refused_naming_it(damaged, captured, no_install):
  text, block = captured['harbor']
  page = pages.to_page(_changed(block, model_fingerprint='1' * 64), damaged.model.config)
  key = damaged.add('harbor-other-model', text, page)  # catalogued as ours: the bytes say otherwise
  with pytest.raises(blocks.GraftError, match=r'harbor-other-model.*another model'):
    damaged.context().assemble([damaged.keys['river'], key])


def test_a_page_of_another_layout_is_refused_naming_it(damaged, captured, no_install):
  text, block = captured['harbor']
  config = damaged.model.config
  n = len(block)
  # Keeps local layer 0 whole (zeros) and the last 7 rows of the others, global layer 5 among them.
  assert config.window(config.num_layers - 1) is None and block.meta.tail_rows == 7
  trimmed = block.replace(
    k=np.zeros((1, n, *block.k.shape[2:]), np.float32),
    v=np.zeros((1, n, *block.v.shape[2:]), np.float32),
    k_tail=np.concatenate([np.asarray(block.k_tail)[1:], np.asarray(block.k)[:, -7:]]),
    v_tail=np.concatenate([np.asarray(block.v_tail)[1:], np.asarray(block.v)[:, -7:]]),
    meta=dataclasses.replace(block.meta, tail_layers=(1, 2, 3, 4, 5)),
  )
  key = damaged.add('harbor-global-trimmed', text, pages.Page(block=trimmed, layout=None))
  with pytest.raises(pages.PageError, match=r'harbor-global-trimmed.*global layer 5'):
    damaged.context().assemble([damaged.keys['river'], key])


def test_a_page_whose_catalogued_layout_is_not_the_stored_one_is_refused(
  damaged, captured, no_install
):
  text, block = captured['harbor']
  page = pages.to_page(block, damaged.model.config)
  key = damaged.add('harbor-miscatalogued', text, page, page_layout=page.rows)
  with pytest.raises(context_lib.PagedContextError, match=r'harbor-miscatalogued.*catalog says'):
    damaged.context().assemble([damaged.keys['river'], key])


def test_rows_with_swapped_keys_are_refused_before_install(damaged, captured, no_install):
  """Two rows whose keys were swapped used to install each other's page silently."""
  target = damaged.model.graft_target
  swapped = catalog_lib.Catalog(':memory:')
  for name, other in (('river', 'orchard'), ('orchard', 'river')):
    text, block = captured[name]
    swapped.add(
      damaged.keys[other],
      text,
      source=name,
      n_tokens=len(block),
      model_fingerprint=target.fingerprint,
      dtype=target.dtype,
      page_layout=pages.to_page(block, damaged.model.config).layout,
      token_ids=block.meta.token_ids,
    )
  ctx = context_lib.PagedContext(damaged.model, damaged.store, swapped, capacity=CAPACITY)
  with pytest.raises(catalog_lib.BindingError, match=r'\(river\).*tokens_sha256'):
    ctx.open(TEXTS['river'], k=1)


def test_a_page_missing_mid_query_is_refused_naming_it(damaged, no_install):
  gone = damaged.keys['stone']
  damaged.store.delete(gone)
  tier = context_lib.HostTier(damaged.store, max_bytes=1 << 20)
  with pytest.raises(store_lib.MissingBlockError, match=gone):
    damaged.context(tier=tier).open(QUERY, k=3)
  assert gone not in tier


def test_a_page_corrupted_mid_query_is_refused_naming_it(damaged, no_install):
  bad = damaged.keys['orchard']
  chunk = os.path.join(damaged.store.root, bad, 'k', 'c.0.0.0.0')
  with open(chunk, 'r+b') as f:
    data = bytearray(f.read())
    data[5] ^= 1
    f.seek(0)
    f.write(bytes(data))
  with pytest.raises(store_lib.CorruptBlockError, match=bad):
    damaged.context().open(QUERY, k=3)


def test_a_page_changed_in_host_memory_is_refused_and_evicted(damaged, no_install):
  tier = context_lib.HostTier(damaged.store, max_bytes=1 << 20)
  key = damaged.keys['river']
  tier.get(key)
  held = tier._held[key].arrays['v']
  held.flat[0] += 1.0
  with pytest.raises(store_lib.CorruptBlockError, match=f'host tier/{key}'):
    damaged.context(tier=tier).assemble([damaged.keys['stone'], key])
  assert key not in tier
  # Read again from the store: the page is fine there.
  assert tier.get(key).block.meta == damaged.store.get(key).meta


def test_a_store_on_an_unknown_kvstore_driver_is_refused_naming_it(model):
  with pytest.raises(store_lib.UnknownDriverError, match='no_such_driver'):
    context_lib.PagedContext.from_spec(
      model, {'driver': 'no_such_driver', 'path': 'p/'}, ':memory:'
    )


def test_host_tier_is_a_byte_bounded_lru(library):
  keys = [library.keys[n] for n in ('river', 'stone', 'orchard')]
  one = context_lib.HostTier(library.store, max_bytes=1 << 20)
  page = one.get(keys[0])
  size = one.nbytes
  stored, layout = library.store.get_page(keys[0])
  assert layout == page.layout and size == stored.nbytes()  # kept rows only, as stored
  hit = one.get(keys[0])
  for name in ('k', 'v', 'k_tail', 'v_tail', 'positions'):
    assert digest(getattr(hit.block, name)) == digest(getattr(stored, name))
  # Room for two of these pages: the least recently used one goes.
  tier = context_lib.HostTier(library.store, max_bytes=2 * size + size // 2)
  tier.get(keys[0])
  tier.get(keys[1])
  tier.get(keys[0])  # keys[1] is now the least recently used
  tier.get(keys[2])
  assert keys[0] in tier and keys[2] in tier and keys[1] not in tier
  assert tier.stats()['evictions'] == 1 and tier.nbytes <= tier.max_bytes
  # A page larger than the bound is returned, not held.
  small = context_lib.HostTier(library.store, max_bytes=size - 1)
  assert small.get(keys[0]).layout == layout and len(small) == 0 and small.nbytes == 0
