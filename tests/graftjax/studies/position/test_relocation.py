"""Relocation and composition: exact for schemes whose keys carry no absolute position.

Every registered scheme is run, and its declared `relocation_exact` is what
the bytes show. The same assertion fails for `rope` with re-rotated keys,
which shows the byte test can fail and that absolute rotary relocation is
not exact. Both hold under impl='xla' and under impl='pallas' (the
chunk-invariant kernels, in the Pallas interpreter on CPU).
"""

import dataclasses

import numpy as np
import pytest

from graftjax import blocks
from graftjax.studies.position import relocation
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import schemes

RNG = np.random.default_rng(11)
BLOCK = [int(t) for t in RNG.integers(3, 256, 10)]
CONT = [int(t) for t in RNG.integers(3, 256, 4)]
LAYOUT = relocation.Layout(capacity=16, chunk_size=4)
OFFSETS = (1, 7, 4096)


@pytest.fixture(scope='module', params=schemes.names())
def model(request):
  return gemma_model.tiny().with_position_scheme(request.param)


def same_bytes(a, b):
  return np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_own_position_graft_is_exact_for_every_scheme(model):
  for offset in (0,) + OFFSETS:
    assert same_bytes(
      relocation.own_position(model, BLOCK, CONT, offset, LAYOUT),
      relocation.fresh_at(model, BLOCK, CONT, offset, LAYOUT),
    ), offset


def test_relocation_is_exact_only_without_absolute_positions(model):
  equal = [
    same_bytes(
      relocation.relocated_to(model, BLOCK, CONT, offset, LAYOUT),
      relocation.fresh_at(model, BLOCK, CONT, offset, LAYOUT),
    )
    for offset in OFFSETS
  ]
  if model.position_scheme == 'rope':
    assert not any(equal)  # re-rotated keys differ in the last bits
  assert all(equal) == schemes.get(model.position_scheme).relocation_exact


def test_composition_is_exact_only_without_absolute_positions(model):
  a, b = BLOCK[:4], BLOCK[4:]
  fresh = relocation.composed_fresh(model, a, b, CONT, (50, 900), LAYOUT)
  grafted = relocation.composed_grafted(model, a, b, CONT, (50, 900), LAYOUT)
  if schemes.get(model.position_scheme).relocation_exact:
    assert same_bytes(fresh, grafted)
  if model.position_scheme == 'rope':
    assert not same_bytes(fresh, grafted)
  np.testing.assert_allclose(fresh, grafted, atol=1e-3)


def test_block_attention_isolates_segments():
  m = gemma_model.tiny()
  alone = relocation.fresh_at(m, BLOCK[4:], CONT, 0, LAYOUT)
  other = relocation.composed_fresh(m, BLOCK[:4], BLOCK[4:], CONT, (0, 0), LAYOUT)
  assert not same_bytes(alone, other)  # the continuation sees both blocks


def test_shifted_block_needs_explicit_consent():
  m = gemma_model.tiny()
  _, cache = m.prefill(BLOCK, cache=m.init_cache(capacity=16), chunk_size=4, logits='none')
  block = blocks.capture(
    cache, blocks.Span(0, len(BLOCK)), token_ids=BLOCK, target=m.graft_target, chunk_size=4
  )
  moved = blocks.relocate(block, 100, model=m)
  assert moved.meta.shift == 100 and int(moved.positions[0]) == 100
  with pytest.raises(blocks.GraftError, match='allow_shifted'):
    blocks.graft(m.init_cache(capacity=16), moved, target=m.graft_target, chunk_size=4)


# impl='pallas': every forward is one chunk of 3 tokens, so each model
# compiles once (the interpreter is slow to build), and the tiny model is cut to one
# sliding-window layer and one global one (both kinds of attention, a third of the programs).
PALLAS_BLOCK, PALLAS_CONT = BLOCK[:6], CONT[:3]
PALLAS_LAYOUT = relocation.Layout(capacity=64, chunk_size=3)
PALLAS_OFFSETS = (64, 200)
LOCAL, GLOBAL = config_lib.AttentionType.LOCAL_SLIDING, config_lib.AttentionType.GLOBAL


def pallas_tiny(scheme):
  return gemma_model.tiny(position_scheme=scheme, impl='pallas', attention_types=(LOCAL, GLOBAL))


@pytest.mark.slow
@pytest.mark.parametrize('scheme', schemes.names())
def test_pallas_relocation_is_exact_only_without_absolute_positions(scheme):
  m = pallas_tiny(scheme)
  fresh = {
    offset: relocation.fresh_at(m, PALLAS_BLOCK, PALLAS_CONT, offset, PALLAS_LAYOUT)
    for offset in PALLAS_OFFSETS
  }
  equal = [
    same_bytes(
      relocation.relocated_to(m, PALLAS_BLOCK, PALLAS_CONT, offset, PALLAS_LAYOUT), fresh[offset]
    )
    for offset in PALLAS_OFFSETS
  ]
  if scheme == 'rope':
    assert not any(equal)  # re-rotated keys differ in the last bits
  assert all(equal) == schemes.get(scheme).relocation_exact
  # ...and the kernels compute the same model as the XLA path.
  xla = relocation.fresh_at(
    m.with_impl('xla'), PALLAS_BLOCK, PALLAS_CONT, PALLAS_OFFSETS[1], PALLAS_LAYOUT
  )
  np.testing.assert_allclose(fresh[PALLAS_OFFSETS[1]], xla, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_pallas_block_attention_matches_xla_and_composes_exactly():
  m = pallas_tiny('alibi')
  a, b = PALLAS_BLOCK[:3], PALLAS_BLOCK[3:]
  # B right after A, inside its sliding window: only segments keep B from A
  # (without them the logits move by ~2).
  offsets = (64, 67)
  fresh = relocation.composed_fresh(m, a, b, PALLAS_CONT, offsets, PALLAS_LAYOUT)
  xla = relocation.composed_fresh(m.with_impl('xla'), a, b, PALLAS_CONT, offsets, PALLAS_LAYOUT)
  np.testing.assert_allclose(fresh, xla, rtol=1e-5, atol=1e-5)
  one_at_a_time = dataclasses.replace(PALLAS_LAYOUT, chunk_size=1)
  assert same_bytes(fresh, relocation.composed_fresh(m, a, b, PALLAS_CONT, offsets, one_at_a_time))
  assert same_bytes(
    fresh, relocation.composed_grafted(m, a, b, PALLAS_CONT, offsets, PALLAS_LAYOUT)
  )


# The Gemma 4 structures cut to a few layers that keep what they test: a global layer of
# head size 32 rotating a quarter of its pairs, and E2B's kv-shared layers (one of each kind,
# reading an earlier layer's keys and values) or 31B's K=V global layer.
GEMMA4_LAYERS = {
  'tiny-gemma4-e2b': {'attention_types': (LOCAL, GLOBAL) * 2, 'num_kv_shared_layers': 2},
  'tiny-gemma4-31b': {'attention_types': (LOCAL, GLOBAL)},
}


@pytest.mark.parametrize('structure', ['tiny-gemma4-e2b', 'tiny-gemma4-31b'])
@pytest.mark.parametrize('scheme', ['rope', 'rope_relative'])
def test_gemma4_relocation_with_partial_rotary(structure, scheme):
  """Global layers of head size 32 rotating a quarter of their pairs, kv sharing or K=V:
  `rope_relative` relocates exactly, re-rotated `rope` keys do not."""
  config = config_lib.get_config(structure).replace(**GEMMA4_LAYERS[structure])
  m = gemma_model.random(config, seed=5).with_position_scheme(scheme)
  assert m.config.global_rotary_fraction == 0.25
  equal = [
    same_bytes(
      relocation.relocated_to(m, BLOCK, CONT, offset, LAYOUT),
      relocation.fresh_at(m, BLOCK, CONT, offset, LAYOUT),
    )
    for offset in (7, 4096)
  ]
  assert all(equal) == (scheme == 'rope_relative')
  if scheme == 'rope':
    assert not any(equal)
