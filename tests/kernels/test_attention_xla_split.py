"""graftjax.kernels.attention_xla_split: the reference's values, and bits that move by whole splits.

Keys of one segment sit in a cache of 1,024 slots in splits of 256; the rows that see them are
compared bit for bit after the keys move. Head shapes are gemma-3-270m's (N=4, K=1, H=256).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from graftjax.kernels import attention_reference
from graftjax.kernels import attention_xla_split

HEADS, KV_HEADS, HEAD_DIM = 4, 1, 256
CAPACITY, SPLIT, KEYS, QUERIES = 1024, 256, 200, 16


def _operands(rng, dtype=jnp.float32):
  q = jnp.asarray(rng.standard_normal((1, QUERIES, HEADS, HEAD_DIM)) * 0.2, dtype)
  k = jnp.asarray(rng.standard_normal((1, KEYS, KV_HEADS, HEAD_DIM)), dtype)
  v = jnp.asarray(rng.standard_normal((1, KEYS, KV_HEADS, HEAD_DIM)), dtype)
  return q, k, v


def _at(q, k, v, slot, *, table=None, window=None, split=SPLIT):
  """The rows (segment 1) of queries after the KEYS keys placed at `slot`, other slots holding
  keys of segment 2 the rows do not see."""
  rng = np.random.default_rng(1)
  full = lambda x: jnp.asarray(rng.standard_normal((1, CAPACITY, KV_HEADS, HEAD_DIM)), x.dtype)
  kc = full(k).at[:, slot : slot + KEYS].set(k)
  vc = full(v).at[:, slot : slot + KEYS].set(v)
  k_pos = np.arange(CAPACITY, dtype=np.int32)[None] % 700
  k_pos[:, slot : slot + KEYS] = np.arange(KEYS)
  k_seg = np.full((1, CAPACITY), 2, np.int32)
  k_seg[:, slot : slot + KEYS] = 1
  q_pos = jnp.asarray(KEYS - QUERIES + np.arange(QUERIES, dtype=np.int32))[None]
  args = (q, kc, vc, q_pos, jnp.asarray(k_pos))
  kwargs = dict(
    q_segments=jnp.ones((1, QUERIES), jnp.int32),
    k_segments=jnp.asarray(k_seg),
    relative_table=table,
    window=window,
  )
  split_out = attention_xla_split.attention_xla_split(*args, block_s=split, **kwargs)
  plain = attention_reference.attention_reference(*args, compute_dtype=None, **kwargs)
  return np.asarray(split_out.astype(jnp.float32)), np.asarray(plain.astype(jnp.float32))


def _table():
  distance = np.arange(1024)[:, None] * (1e4 ** (-np.arange(HEAD_DIM // 2) / (HEAD_DIM // 2)))
  return jnp.asarray(np.cos(distance), jnp.float32), jnp.asarray(np.sin(distance), jnp.float32)


@pytest.mark.parametrize('relative', [False, True])
def test_values_agree_with_the_reference(relative):
  q, k, v = _operands(np.random.default_rng(0))
  got, want = _at(q, k, v, 300, table=_table() if relative else None, window=64)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  assert np.abs(got).max() > 0.1  # the rows saw their keys


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('relative', [False, True])
def test_keys_moved_by_whole_splits_give_the_same_bits(dtype, relative):
  q, k, v = _operands(np.random.default_rng(0), dtype)
  table = _table() if relative else None
  at_0 = _at(q, k, v, 0, table=table)[0]
  for slot in (SPLIT, 3 * SPLIT):
    assert _at(q, k, v, slot, table=table)[0].tobytes() == at_0.tobytes(), slot


def test_keys_that_straddle_a_split_fold_otherwise():
  """The failure case: the same keys across the split boundary at 256 are summed in two splits."""
  q, k, v = _operands(np.random.default_rng(0))
  at_0 = _at(q, k, v, 0)[0]
  straddling = _at(q, k, v, SPLIT - KEYS // 2)[0]
  np.testing.assert_allclose(straddling, at_0, rtol=1e-5, atol=1e-5)
  if straddling.tobytes() == at_0.tobytes():  # a property of rounding, not of the design
    pytest.skip('on this machine the split-straddling keys happened to round alike')


def test_a_cache_of_no_whole_split_is_padded_with_empty_slots():
  q, k, v = _operands(np.random.default_rng(0))
  q_pos = jnp.full((1, QUERIES), KEYS, jnp.int32)
  k_pos = jnp.arange(KEYS, dtype=jnp.int32)[None]
  got = attention_xla_split.attention_xla_split(q, k, v, q_pos, k_pos, block_s=SPLIT)
  want = attention_reference.attention_reference(q, k, v, q_pos, k_pos)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)
  with pytest.raises(ValueError, match='block_s must be positive'):
    attention_xla_split.attention_xla_split(q, k, v, q_pos, k_pos, block_s=0)
