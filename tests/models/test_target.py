"""A block refused by a model of another structure says what differs, not only two hashes."""

import dataclasses

import numpy as np
import pytest
from graftjax import blocks
from graftjax.models import target as target_lib
from graftjax.models.gemma import model as gemma_model

from tests.models.gemma import tokenizer_files

PREFIX = np.arange(2, 14, dtype=np.int32)


@pytest.fixture(scope='module')
def base():
  return gemma_model.tiny(vocab_size=400)


def _block(model):
  _, cache = model.prefill(PREFIX, cache=model.init_cache(capacity=32), chunk_size=4, logits='none')
  return blocks.capture(
    cache, blocks.Span(0, PREFIX.size), token_ids=PREFIX, target=model.graft_target, chunk_size=4
  )


def _refusal(block, model) -> str:
  with pytest.raises(blocks.GraftError, match='another model') as e:
    blocks.graft(model.init_cache(capacity=32), block, target=model.graft_target, chunk_size=4)
  return str(e.value)


def _vocab():
  return tokenizer_files.small_vocabulary(400)


@pytest.mark.parametrize(
  'change, said',
  [
    (
      lambda m: gemma_model.tiny(vocab_size=400, sliding_window=16),
      'config sliding_window: 8 != 16',
    ),
    (lambda m: gemma_model.tiny(vocab_size=400, num_kv_heads=2), 'config num_kv_heads: 1 != 2'),
    (lambda m: gemma_model.tiny(vocab_size=400, seed=3), 'weights digest: '),
    (lambda m: m.with_local_cache('ring', chunk_size=8), "cache layout: 'full' != 'ring/8'"),
    (lambda m: dataclasses.replace(m, tokenizer=_vocab()), "tokenizer digest: 'none' != '"),
  ],
)
def test_the_refusal_names_what_differs(base, change, said):
  other = change(base)
  message = _refusal(_block(base), other)
  assert said in message, message
  assert base.fingerprint[:16] in message and other.fingerprint[:16] in message


def test_only_what_differs_is_named(base):
  message = _refusal(_block(base), gemma_model.tiny(vocab_size=400, sliding_window=16))
  assert 'weights digest' not in message and 'tokenizer' not in message
  assert message.count('config ') == 1


def test_a_block_of_a_model_this_process_never_saw_names_this_models_inputs(base):
  block = _block(base)
  stranger = dataclasses.replace(
    block, meta=dataclasses.replace(block.meta, model_fingerprint='f' * 64)
  )
  message = _refusal(stranger, base)
  assert 'not loaded in this process' in message and 'window 8' in message
  assert base.params_digest[:16] in message and "cache layout 'full'" in message


def test_describe_difference_of_equal_targets_is_empty_and_of_bare_ones_says_so(base):
  assert target_lib.describe_difference(base.graft_target, base.graft_target) == ''
  bare = dataclasses.replace(base.graft_target, identity=None)
  assert 'does not say' in target_lib.describe_difference(bare, base.graft_target)
  assert target_lib.known(base.fingerprint).identity == base.fingerprint_inputs


def test_many_config_fields_are_cut_to_a_count(base):
  other = gemma_model.tiny(
    vocab_size=400,
    sliding_window=16,
    num_heads=8,
    num_kv_heads=2,
    head_dim=8,
    hidden_dim=32,
    embed_dim=64,
    rms_norm_eps=1e-5,
    local_rope_theta=1e3,
    global_rope_theta=1e5,
    bos_id=3,
  )
  message = target_lib.describe_difference(base.graft_target, other.graft_target)
  assert 'more config fields' in message


def test_remembering_a_target_keeps_no_model_alive():
  import gc
  import weakref

  m = gemma_model.tiny(vocab_size=400, seed=11)
  fingerprint, alive = m.graft_target.fingerprint, weakref.ref(m)
  del m
  gc.collect()
  assert alive() is None and target_lib.known(fingerprint) is not None
