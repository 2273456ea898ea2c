"""Pages: a continuation after an installed page is byte-equal to one after the full block.

Four layers, two of them global, and a one-chunk continuation keep the compiled programs few
and small (a program's compile time grows with its layers)."""

import dataclasses
import hashlib
import os

import jax.numpy as jnp
import numpy as np
import pytest
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.paging import pages
from graftjax.studies.paging import bench_paging_pagein

L, G = config_lib.AttentionType.LOCAL_SLIDING, config_lib.AttentionType.GLOBAL
PATTERN = (L, G, L, G)  # two global layers of four
WINDOW = 8
N = 24  # block tokens: 3 windows
CAPACITY = 64  # a multiple of 64 for the Pallas kernels
CHUNK = 4
PREFIX = np.random.default_rng(5).integers(3, 256, N).astype(np.int32)
CONT = np.random.default_rng(6).integers(3, 256, CHUNK).astype(np.int32)


def _model(dtype=jnp.float32, impl='xla'):
  return gemma_model.tiny(
    dtype=dtype, attention_types=PATTERN, sliding_window=WINDOW, impl=impl, seed=1
  )


def _sha(logits) -> str:
  return hashlib.sha256(np.asarray(logits).tobytes()).hexdigest()


def _block(model):
  """The full block: every row of every layer (keep='span'), which pages are cut from."""
  # Logits 'all', as the continuation asks: both run one compiled program.
  _, cache = model.prefill(
    PREFIX, cache=model.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='all'
  )
  return blocks.capture(
    cache,
    blocks.Span(0, N),
    token_ids=PREFIX,
    target=model.graft_target,
    chunk_size=CHUNK,
    keep='span',
  )


def _continue(model, cache, start=N):
  logits, _ = model.prefill(CONT, cache=cache, chunk_size=CHUNK, start_position=start, logits='all')
  return logits


def _after(model, block, start=N, query_position=None):
  """The continuation at `start` after `block` grafted; `query_position` passed to graft (a
  page that serves later queries only is grafted for an earlier one by saying a later one)."""
  cache = blocks.graft(
    model.init_cache(capacity=CAPACITY),
    block,
    target=model.graft_target,
    chunk_size=CHUNK,
    query_position=query_position,
  )
  return _sha(_continue(model, cache, start))


def _install(model, page, **kwargs):
  """`page` installed in a new cache of `model` (kwargs: query_position)."""
  return pages.install(
    model.init_cache(capacity=CAPACITY),
    page,
    target=model.graft_target,
    config=model.config,
    chunk_size=CHUNK,
    **kwargs,
  )


def _page_in(model, store, key):
  """The page stored under `key` read, verified and installed in a new cache of `model`."""
  return pages.page_in(
    store,
    key,
    model.init_cache(capacity=CAPACITY),
    target=model.graft_target,
    config=model.config,
    chunk_size=CHUNK,
  )


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_page_then_continue_is_byte_equal_to_full_block(dtype):
  model = _model(dtype)
  block = _block(model)
  page = pages.to_page(block, model.config)
  assert page.rows == ((N - 7, N), (0, N)) * 2
  assert page.local_rows == WINDOW - 1 and page.layout is None
  # The page really dropped rows: its local layers hold their last 7 only.
  assert page.block.k_tail.shape[1] == 7 and block.k_tail.shape[1] == N
  cache = _install(model, page)
  assert _sha(_continue(model, cache)) == _after(model, block)


def test_one_row_too_many_trimmed_is_not_byte_equal():
  model = _model()
  block = _block(model)
  short = pages.to_page(block, model.config, local_rows=WINDOW - 2)
  # install refuses it for the query right after the block ...
  with pytest.raises(pages.PageError, match='exact from position 25'):
    _install(model, short, query_position=N)
  # ... and rightly so: grafted anyway, the first query sees a zeroed row.
  assert _after(model, short.block, query_position=N + 1) != _after(model, block)


def test_a_page_of_fewer_rows_is_exact_for_queries_far_enough():
  """r local rows are exact from position e + (W - 1 - r); r = 0 keeps the global layers only."""
  model = _model()
  block = _block(model)
  for rows in (0, 3):
    page = pages.to_page(block, model.config, local_rows=rows)
    start = page.first_exact_position(model.config)
    assert start == N + WINDOW - 1 - rows
    cache = _install(model, page, query_position=start)
    assert _sha(_continue(model, cache, start)) == _after(model, block, start)
    # One position earlier, the first query sees a dropped row.
    early = _after(model, page.block, start - 1, query_position=start)
    assert early != _after(model, block, start - 1)


@pytest.mark.slow
def test_page_exact_under_chunk_invariant_kernels():
  model = _model(impl='pallas')
  block = _block(model)
  page = pages.to_page(block, model.config)
  cache = _install(model, page)
  assert _sha(_continue(model, cache)) == _after(model, block)


def test_stored_page_round_trip_is_smaller_and_exact(tmp_path):
  model = _model()
  block = _block(model)
  page = pages.to_page(block, model.config)
  store = store_lib.BlockStore(tmp_path / 'store')
  block_key = store.put(block)
  key = pages.put(store, page)
  assert key != block_key and key == store_lib.key_for(page.block.meta)
  assert sorted(store.list()) == sorted([key, block_key])
  back = pages.get(store, key)
  assert back.layout is None and back.rows == page.rows
  for name in ('k', 'v', 'k_tail', 'v_tail', 'positions'):
    assert np.asarray(getattr(back.block, name)).tobytes() == (
      np.asarray(getattr(page.block, name)).tobytes()
    )
  assert pages.get(store, block_key).layout is None
  sizes = {k: bench_paging_pagein.chunk_bytes(store.root, k) for k in (key, block_key)}
  # 2 global layers x 24 rows + 2 local layers x 7 rows, against 4 x 24 rows.
  row = 2 * 16 * 4  # k and v, K=1, H=16, float32
  assert sizes[key] == (2 * N + 2 * 7) * row + 4 * N
  assert sizes[block_key] == 4 * N * row + 4 * N
  assert page.nbytes() == sizes[key]
  cache = _page_in(model, store, key)
  assert _sha(_continue(model, cache)) == _after(model, block)


def test_corrupt_page_is_refused_and_cache_untouched(tmp_path):
  model = _model()
  store = store_lib.BlockStore(tmp_path / 'store')
  key = pages.put(store, pages.to_page(_block(model), model.config))
  chunk = os.path.join(store.root, key, 'k_tail', 'c.1.0.0.0')
  with open(chunk, 'r+b') as f:
    first = f.read(1)
    f.seek(0)
    f.write(bytes([first[0] ^ 1]))
  with pytest.raises(store_lib.CorruptBlockError, match='k_tail'):
    _page_in(model, store, key)


def test_page_of_another_layout_or_model_is_refused():
  model = _model()
  block = _block(model)
  page = pages.to_page(block, model.config)
  # A model whose global layer sits where the page trimmed a local one.
  other = _model().config.replace(attention_types=(G, L, L, G))
  with pytest.raises(pages.PageError, match='global layer 0'):
    pages.check_page(page, other, query_position=None)
  with pytest.raises(pages.PageError, match='layers'):
    pages.to_page(block, config_lib.tiny(attention_types=PATTERN[:3]))
  stranger = gemma_model.tiny(attention_types=PATTERN, sliding_window=WINDOW, seed=2)
  with pytest.raises(blocks.GraftError, match='another model'):
    _install(stranger, page)


def test_store_refuses_layouts_that_are_not_pages(tmp_path):
  model = _model()
  block = _block(model)
  store = store_lib.BlockStore(tmp_path / 'store')
  bad = [
    ((0, N),) * 4,  # nothing trimmed: a block
    ((1, N),) * 4,  # no layer whole
    ((0, N),) * 2 + ((3, N), (4, N)),  # two tail lengths
    ((0, N),) * 3,  # a layer missing
  ]
  # A page layout applies to blocks of layout 3 only (every row of every layer in k, v).
  block = block.replace(
    k=np.zeros((4, N, 1, 16), np.float32),
    v=np.zeros((4, N, 1, 16), np.float32),
    k_tail=None,
    v_tail=None,
    meta=dataclasses.replace(block.meta, tail_layers=(), tail_rows=0, layout_version=3),
  )
  for layout in bad:
    with pytest.raises(store_lib.InvalidBlockError, match='page_layout'):
      store.put(block, page_layout=layout)
  assert store.list() == []


def test_bytes_per_token_of_the_real_config():
  config = config_lib.gemma3_270m()
  assert pages.local_rows_needed(config) == 511
  bf16 = pages.bytes_per_token(config, 'bfloat16')
  assert (bf16['block'], bf16['page'], bf16['ratio']) == (18_432.0, 3_072.0, 6.0)
  assert pages.bytes_per_token(config, 'float32')['page'] == 6_144.0
  at_2k = pages.bytes_per_token(config, 'bfloat16', 2048)
  assert at_2k['page'] == (3 * 2048 + 15 * 511) * 1024 / 2048


def test_a_stored_page_records_its_chunk_size_and_page_in_holds_the_caller_to_it(tmp_path):
  """Fails on the code before: a page recorded no chunk size, and page_in took it into a cache
  whatever chunks were in force."""
  model = _model()
  store = store_lib.BlockStore(tmp_path / 'store')
  key = pages.put(store, pages.to_page(_block(model), model.config))
  got = pages.get(store, key)
  assert got.local_rows == WINDOW - 1 and got.block.meta.chunk_size == CHUNK
  kwargs = {'target': model.graft_target, 'config': model.config}
  for chunk_size, match in (
    (None, 'no chunk size in force'),
    (CHUNK + 1, f'chunks of {CHUNK + 1}'),
  ):
    with pytest.raises(blocks.GraftError, match=match):
      pages.page_in(
        store, key, model.init_cache(capacity=CAPACITY), chunk_size=chunk_size, **kwargs
      )
  assert _sha(_continue(model, _page_in(model, store, key))) == _after(model, _block(model))
