"""Compact blocks (layout 4): a block holds exactly the rows a continuation after its last
token attends to, on tiny Gemma 3 and Gemma 4 structures, and grafts byte-exact.

A query at position p of a sliding-window layer sees keys at p - W < q <= p
(`kernels.attention_reference.visible`): the continuation right after a block of n rows sees
its last min(n, W - 1) rows there, every row of a global layer, and nothing of a kv-sharing
layer (it reads its source's). Each structure is cut to the fewest layers that keep it (a
program's compile time grows with its layers).
"""

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

from graftjax import blocks
from graftjax import restore as restore_lib
from graftjax import store as store_lib

IDS = np.random.default_rng(40).integers(3, 256, 20).astype(np.int32)
CONT = np.random.default_rng(41).integers(3, 256, 4).astype(np.int32)  # one chunk
CAPACITY, CHUNK = 32, 4
# One sliding and one global layer; E2B's two are each read again by a kv-sharing layer.
LAYERS = {
  'tiny': dict(attention_types=config_lib.attention_pattern(2, 1)),
  'tiny-gemma4-31b': dict(attention_types=config_lib.attention_pattern(2, 1)),
  'tiny-gemma4-e2b': dict(
    attention_types=config_lib.attention_pattern(4, 1), num_kv_shared_layers=2
  ),
}


@functools.cache
def _model(name, layout, **overrides):
  config = config_lib.get_config(name, **(LAYERS[name] | overrides))
  m = gemma_model.random(config, seed=3)
  return m.with_local_cache(layout, chunk_size=CHUNK)


def _prefilled(m, ids=IDS):
  # Logits 'all', as the continuation asks: both run one compiled program.
  _, cache = m.prefill(ids, cache=m.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='all')
  return cache


def _continued(m, cache, start):
  out, _ = m.prefill(CONT, cache=cache, chunk_size=CHUNK, start_position=start, logits='all')
  return np.asarray(out)


def _capture(m, cache, n=IDS.size, keep='needed'):
  return blocks.capture(
    cache, blocks.Span(0, n), token_ids=IDS[:n], target=m.graft_target, chunk_size=CHUNK, keep=keep
  )


def predicted_bytes(config, n, dtype='float32'):
  """k, v of every global cached layer's n rows and every sliding one's min(n, W - 1), and
  int32 positions: from the config alone."""
  itemsize = np.dtype(jnp.dtype(dtype)).itemsize
  rows = lambda layer: n if config.window(layer) is None else min(n, config.window(layer) - 1)
  row = lambda layer: config.kv_heads_of(layer) * config.head_dim_of(layer) * itemsize
  return sum(2 * rows(i) * row(i) for i in config.cached_layers) + 4 * n


CASES = [
  ('tiny', 'ring', {}),  # W 8, ring of 11: 20 tokens wrap it
  ('tiny', 'full', {}),
  ('tiny', 'ring', {'sliding_window': 7}),  # W - 1 + chunk = 10: not a multiple of the chunk
  ('tiny-gemma4-31b', 'ring', {}),  # K=V global layer with its own kv heads and head size
  ('tiny-gemma4-e2b', 'full', {}),  # the last 2 of 4 layers share kv: the block holds 2
]


@pytest.mark.parametrize('name, layout, overrides', CASES)
def test_a_compact_block_holds_the_rows_a_continuation_sees_and_grafts_byte_exact(
  name, layout, overrides, tmp_path
):
  m = _model(name, layout, **overrides)
  cache = _prefilled(m)
  block = _capture(m, cache)
  fresh = _continued(m, cache, IDS.size)  # takes the cache (prefill donates it)
  config, n = m.config, IDS.size
  sliding = tuple(i for i in config.cached_layers if config.window(i) is not None)
  assert block.num_layers == len(config.cached_layers)
  assert block.meta.tail_layers == sliding
  assert block.meta.tail_rows == config.sliding_window - 1
  assert block.nbytes() == predicted_bytes(config, n)
  grafted = blocks.graft(
    m.init_cache(capacity=CAPACITY), block, target=m.graft_target, chunk_size=4
  )
  assert _continued(m, grafted, n).tobytes() == fresh.tobytes()

  store = store_lib.BlockStore(tmp_path / 'store')
  key = store.put(block)
  meta, _ = store.read_meta(key)
  assert (meta.tail_layers, meta.tail_rows) == (sliding, config.sliding_window - 1)
  stored = store.get(key).arrays()
  assert sum(a.nbytes for a in stored.values()) == predicted_bytes(config, n)
  restored = restore_lib.restore(
    store,
    key,
    m.init_cache(capacity=CAPACITY),
    target=m.graft_target,
    token_ids=IDS,
    chunk_size=CHUNK,
  )
  assert _continued(m, restored, n).tobytes() == fresh.tobytes()


def test_a_short_block_keeps_every_row_and_grafts_byte_exact():
  m = _model('tiny', 'ring')
  short = IDS[:4]  # fewer than W - 1 = 7 rows
  cache = _prefilled(m, short)
  block = _capture(m, cache, 4)
  fresh = _continued(m, cache, 4)
  assert block.meta.tail_rows == 4 and block.nbytes() == predicted_bytes(m.config, 4)
  grafted = blocks.graft(
    m.init_cache(capacity=CAPACITY), block, target=m.graft_target, chunk_size=4
  )
  assert _continued(m, grafted, 4).tobytes() == fresh.tobytes()


def test_continuing_from_inside_needs_keep_span():
  """A prefix of a compact block is refused; keep='span' holds every row and serves it."""
  m = _model('tiny', 'ring')
  cache = _prefilled(m)
  compact = _capture(m, cache)
  with pytest.raises(blocks.GraftError, match="capture it with keep='span'"):
    blocks.prefix(compact, 12, target=m.graft_target)
  assert blocks.prefix(compact, IDS.size, target=m.graft_target).meta == compact.meta

  full = _model('tiny', 'full')
  spanned = _capture(full, _prefilled(full), keep='span')
  assert spanned.meta.tail_rows == IDS.size
  head = blocks.prefix(spanned, 12, target=full.graft_target)
  assert (len(head), head.meta.tail_rows) == (12, 7)
  grafted = blocks.graft(
    full.init_cache(capacity=CAPACITY), head, target=full.graft_target, chunk_size=4
  )
  fresh = _continued(full, _prefilled(full, IDS[:12]), 12)
  assert _continued(full, grafted, 12).tobytes() == fresh.tobytes()


def test_refusals():
  m = _model('tiny', 'ring')
  cache = _prefilled(m)  # a ring of 11 slots now holds slots [9, 20)
  with pytest.raises(blocks.GraftError, match='keep must be one of'):
    _capture(m, cache, keep='all')
  with pytest.raises(blocks.GraftError, match='capture it before writing further'):
    blocks.capture(
      cache, blocks.Span(0, 8), token_ids=IDS[:8], target=m.graft_target, chunk_size=CHUNK
    )
  with pytest.raises(blocks.GraftError, match='capture it before writing further'):
    _capture(m, cache, keep='span')  # every row: the ring dropped slots [0, 9)
  block = _capture(m, cache)
  target, new = m.graft_target, lambda: m.init_cache(capacity=CAPACITY)
  # A page: a tail shorter than W - 1 serves only later queries.
  cut = block.replace(
    k_tail=block.k_tail[:, 3:],
    v_tail=block.v_tail[:, 3:],
    meta=dataclasses.replace(block.meta, tail_rows=4),
  )
  with pytest.raises(blocks.PageError, match='pass query_position'):
    blocks.graft(new(), cut, target=target, chunk_size=4)
  with pytest.raises(blocks.PageError, match='exact from position 23'):
    blocks.graft(new(), cut, target=target, chunk_size=4, query_position=22)
  assert int(blocks.graft(new(), cut, target=target, chunk_size=4, query_position=23).length) == 20
  # Rows of a global layer dropped: a later query sees them.
  zeros = lambda rows, layers: np.zeros((layers, rows, 1, 16), np.float32)
  wrong = block.replace(
    k=zeros(20, 0),
    v=zeros(20, 0),
    k_tail=zeros(7, 2),
    v_tail=zeros(7, 2),
    meta=dataclasses.replace(block.meta, tail_layers=(0, 1)),
  )
  with pytest.raises(blocks.GraftError, match='global layer 1'):
    blocks.graft(new(), wrong, target=target, chunk_size=4)


def test_a_span_of_non_int_bounds_is_refused():
  """Fails on the code before: Span(2.5, 4) was made, and capture failed in numpy."""
  for bounds in ((2.5, 4), (0, 4.0), (True, 4), (np.float32(1), 4)):
    with pytest.raises(blocks.GraftError, match='a span is two ints'):
      blocks.Span(*bounds)
