"""Composition: stored blocks side by side are byte-equal to a fresh block-attention prefill.

Tiny model cut to one sliding and one global layer (a program's compile time grows with its
layers), float32, rope_relative, Pallas kernels (the interpreter on CPU). Every block is
deposited as the library deposits it: prefilled alone at slot 0 and captured. One capacity and one
chunk size throughout, so each program compiles once.
"""

import dataclasses
import hashlib

import jax.numpy as jnp
import numpy as np
import pytest

from graftjax import blocks
from graftjax import compose
from graftjax import store as store_lib
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

CAPACITY, CHUNK = 1024, 8
LAYERS = config_lib.attention_pattern(2, 1)  # one sliding layer, one global
RNG = np.random.default_rng(5)
# Three blocks of different lengths (each a multiple of CHUNK: one chunk shape to compile).
TEXTS = [[2] + [int(t) for t in RNG.integers(3, 256, n - 1)] for n in (24, 40, 16)]
QUERY = [int(t) for t in RNG.integers(3, 256, CHUNK)]


@pytest.fixture(scope='module')
def model():
  return (
    gemma_model.tiny(attention_types=LAYERS)
    .with_position_scheme('rope_relative')
    .with_impl('pallas')
  )


@pytest.fixture(scope='module')
def library(model, tmp_path_factory):
  """(store, keys): each text prefilled alone at slot 0 and deposited."""
  store = store_lib.BlockStore(tmp_path_factory.mktemp('compose') / 'blocks')
  keys = []
  for ids in TEXTS:
    _, cache = model.prefill(
      ids, cache=model.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='none'
    )
    block = blocks.capture(
      cache, blocks.Span(0, len(ids)), token_ids=ids, target=model.graft_target, chunk_size=CHUNK
    )
    keys.append(store.put(block))
  return store, keys


def digest(a) -> str:
  return hashlib.sha256(np.asarray(a).tobytes()).hexdigest()


def seen(model, cache, layout) -> dict[str, np.ndarray]:
  """The cache's arrays, its sliding-window layers' rows that no query after `layout` sees
  (position < next_position - (W - 1): a compact block does not hold them) zeroed."""
  config = model.config
  first = layout.next_position - (config.sliding_window - 1)
  hidden = np.asarray(cache.positions) < first  # [B, S]
  out = {f: np.asarray(getattr(cache, f)) for f in ('positions', 'segments', 'length')}
  for f in ('k', 'v'):
    rows = np.array(getattr(cache, f))
    for layer in range(config.num_layers):
      if config.window(layer) is not None:
        rows[layer][hidden] = 0
    out[f] = rows
  return out


def same_cache(model, a, b, layout) -> bool:
  """Whether two caches hold the same bytes in every row a query after `layout` sees."""
  x, y = seen(model, a, layout), seen(model, b, layout)
  return all(digest(x[f]) == digest(y[f]) for f in x)


def query_logits(model, cache, layout):
  logits, _ = model.prefill(
    QUERY, cache=cache, chunk_size=CHUNK, start_position=layout.next_position, logits='all'
  )
  return np.asarray(logits)


@pytest.mark.slow
@pytest.mark.parametrize('k', [2, 3])
def test_composed_context_is_byte_equal_to_fresh_prefill(model, library, k):
  store, keys = library
  cache, layout = compose.compose(model, store, keys[:k], capacity=CAPACITY)
  assert layout.page == 256  # float32 split
  assert [p.slot for p in layout.placements] == [0, 256, 512][:k]
  assert [p.segment for p in layout.placements] == [1, 2, 3][:k]
  assert [p.position for p in layout.placements] == [0, 24, 64][:k]
  fresh = compose.fresh_layout(model, TEXTS[:k], layout, chunk_size=CHUNK)
  assert same_cache(model, cache, fresh, layout)
  composed_logits = query_logits(model, cache, layout)
  assert digest(composed_logits) == digest(query_logits(model, fresh, layout))
  # The query sees every block: without the last one its logits change.
  if k == 3:
    two, two_layout = compose.compose(model, store, keys[:2], capacity=CAPACITY)
    assert not np.allclose(composed_logits[0, -1], query_logits(model, two, two_layout)[0, -1])


def test_explicit_pages_are_byte_equal_to_fresh_prefill(model, library):
  store, keys = library
  cache, layout = compose.compose(model, store, keys[:2], capacity=CAPACITY, slots=(256, 768))
  fresh = compose.fresh_layout(model, TEXTS[:2], layout, chunk_size=CHUNK)
  assert same_cache(model, cache, fresh, layout)
  assert digest(query_logits(model, cache, layout)) == digest(query_logits(model, fresh, layout))


def test_a_move_across_a_split_boundary_is_not_exact(model, library):
  """The failure the page rule prevents: block 2 (40 tokens) at slot 224 straddles slots 256."""
  store, keys = library
  layout = compose.plan([24, 40], capacity=CAPACITY, page=32, slots=(0, 224))
  placed = [compose._placed(model, store.get(k), p) for k, p in zip(keys, layout.placements)]
  cache = compose._install(model, model.init_cache(capacity=CAPACITY), placed)
  fresh = compose.fresh_layout(model, TEXTS[:2], layout, chunk_size=CHUNK)
  with pytest.raises(compose.ComposeError, match='multiple of the attention split'):
    compose.compose(model, store, keys[:2], capacity=CAPACITY, page=32, slots=(0, 224))
  if same_cache(model, cache, fresh, layout):  # a property of rounding, not of the design
    pytest.skip('on this machine the split-straddling block happened to round alike')
  # Close, but not the same bits: the block's rows folded over one split, now over two.
  np.testing.assert_allclose(
    seen(model, cache, layout)['k'], seen(model, fresh, layout)['k'], atol=1e-4
  )


def test_plan_places_blocks_on_free_pages():
  layout = compose.plan([300, 5, 256], capacity=1024, page=256)
  assert [(p.slot, p.position, p.segment) for p in layout.placements] == [
    (0, 0, 1),
    (512, 300, 2),
    (768, 305, 3),
  ]
  assert layout.length == 1024 and layout.next_position == 561


@pytest.mark.parametrize(
  'lengths, slots, capacity, match',
  [
    ([24, 40], (0, 0), 1024, 'overlaps'),
    ([300, 40], (0, 256), 1024, 'overlaps'),
    ([24, 40], (256, 0), 1024, 'overlaps'),
    ([24, 40], (0, 128), 1024, 'page boundary'),
    ([24, 40], None, 256, 'does not fit'),
    ([24, 40], None, 1000, 'whole number of pages'),
    ([], None, 1024, 'no blocks'),
  ],
)
def test_plan_refuses(lengths, slots, capacity, match):
  with pytest.raises(compose.ComposeError, match=match):
    compose.plan(lengths, capacity=capacity, page=256, slots=slots)


def test_compose_refuses_models_that_cannot_compose_exactly(model, library):
  store, keys = library
  with pytest.raises(compose.ComposeError, match='splits anchored at absolute slots'):
    compose.compose(model.with_impl('xla'), store, keys, capacity=CAPACITY)
  with pytest.raises(compose.ComposeError, match="needs 'rope_relative'"):
    compose.compose(model.with_position_scheme('rope'), store, keys, capacity=CAPACITY)
  with pytest.raises(compose.ComposeError, match=r'not a multiple of the attention split \(256'):
    compose.compose(model, store, keys, capacity=CAPACITY, page=128)
  with pytest.raises(compose.ComposeError, match='does not fit'):
    compose.compose(model, store, keys, capacity=512)


@pytest.mark.parametrize(
  'change, error, match',
  [
    ({'model_fingerprint': '0' * 64}, blocks.GraftError, 'another model'),
    ({'position_scheme': 'rope'}, blocks.GraftError, 'scheme'),
    ({'start': 256}, compose.ComposeError, 'captured at slot 256'),
  ],
)
def test_compose_refuses_blocks_it_cannot_place(model, library, change, error, match):
  store, keys = library
  block = store.get(keys[0])
  other = store.put(dataclasses.replace(block, meta=dataclasses.replace(block.meta, **change)))
  with pytest.raises(error, match=match):
    compose.compose(model, store, [keys[1], other], capacity=CAPACITY)


def test_compose_refuses_a_missing_block(model, library):
  store, keys = library
  with pytest.raises(store_lib.StoreError):
    compose.compose(model, store, [keys[0], 'f' * 64], capacity=CAPACITY)


@pytest.mark.slow
def test_bfloat16_pages_are_byte_equal_to_fresh_prefill(tmp_path):
  """bfloat16's split is 512 slots: pages of 512."""
  m = (
    gemma_model.tiny(dtype=jnp.bfloat16, attention_types=LAYERS)
    .with_position_scheme('rope_relative')
    .with_impl('pallas')
  )
  store = store_lib.BlockStore(tmp_path / 'blocks')
  keys = []
  for ids in TEXTS[:2]:
    _, cache = m.prefill(
      ids, cache=m.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='none'
    )
    block = blocks.capture(
      cache, blocks.Span(0, len(ids)), token_ids=ids, target=m.graft_target, chunk_size=CHUNK
    )
    keys.append(store.put(block))
  cache, layout = compose.compose(m, store, keys, capacity=CAPACITY)
  assert [p.slot for p in layout.placements] == [0, 512]
  fresh = compose.fresh_layout(m, TEXTS[:2], layout, chunk_size=CHUNK)
  assert same_cache(m, cache, fresh, layout)
  assert digest(query_logits(m, cache, layout)) == digest(query_logits(m, fresh, layout))
