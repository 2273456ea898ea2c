"""Relocation and composition: exact for schemes whose keys carry no absolute position.

The same assertion fails for `rope` with re-rotated keys, which shows the
byte test can fail and that absolute rotary relocation is not exact.
"""

import numpy as np
import pytest

from graftjax import blocks
from graftjax import relocation
from graftjax.models.gemma import model as gemma_model

RNG = np.random.default_rng(11)
BLOCK = [int(t) for t in RNG.integers(3, 256, 10)]
CONT = [int(t) for t in RNG.integers(3, 256, 4)]
LAYOUT = relocation.Layout(capacity=16, chunk_size=4)
OFFSETS = (1, 7, 4096)


@pytest.fixture(scope='module', params=['rope', 'rope_relative', 'alibi', 'nope'])
def model(request):
  return gemma_model.tiny().with_position_scheme(request.param)


def same_bytes(a, b):
  return np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_own_position_graft_is_exact_for_every_scheme(model):
  for offset in (0,) + OFFSETS:
    assert same_bytes(relocation.own_position(model, BLOCK, CONT, offset, LAYOUT),
                      relocation.fresh_at(model, BLOCK, CONT, offset, LAYOUT)), offset


def test_relocation_is_exact_only_without_absolute_positions(model):
  equal = [same_bytes(relocation.relocated_to(model, BLOCK, CONT, offset, LAYOUT),
                      relocation.fresh_at(model, BLOCK, CONT, offset, LAYOUT))
           for offset in OFFSETS]
  if model.position_scheme == 'rope':
    assert not any(equal)  # re-rotated keys differ in the last bits
  else:
    assert all(equal)


def test_composition_is_exact_only_without_absolute_positions(model):
  a, b = BLOCK[:4], BLOCK[4:]
  fresh = relocation.composed_fresh(model, a, b, CONT, (50, 900), LAYOUT)
  grafted = relocation.composed_grafted(model, a, b, CONT, (50, 900), LAYOUT)
  assert same_bytes(fresh, grafted) == (model.position_scheme != 'rope')
  np.testing.assert_allclose(fresh, grafted, atol=1e-3)


def test_block_attention_isolates_segments():
  m = gemma_model.tiny()
  alone = relocation.fresh_at(m, BLOCK[4:], CONT, 0, LAYOUT)
  other = relocation.composed_fresh(m, BLOCK[:4], BLOCK[4:], CONT, (0, 0), LAYOUT)
  assert not same_bytes(alone, other)  # the continuation sees both blocks


def test_shifted_block_needs_explicit_consent():
  m = gemma_model.tiny()
  _, cache = m.prefill(BLOCK, cache=m.init_cache(capacity=16), chunk_size=4, logits='none')
  block = blocks.capture(cache, blocks.Span(0, len(BLOCK)), token_ids=BLOCK,
                         model_fingerprint=m.fingerprint, position_scheme=m.position_scheme)
  moved = m.relocate(block, 100)
  assert moved.meta.shift == 100 and int(moved.positions[0]) == 100
  with pytest.raises(blocks.GraftError, match='allow_shifted'):
    blocks.graft(m.init_cache(capacity=16), moved, model_fingerprint=m.fingerprint,
                 position_scheme=m.position_scheme)
