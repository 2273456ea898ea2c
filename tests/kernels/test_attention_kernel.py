"""graftjax.kernels.attention: against the reference, and bit-invariance.

Runs the kernel natively on GPU and in the Pallas interpreter elsewhere.
Shapes are small; head shapes are gemma-3-270m's (N=4, K=1, H=256) unless a
test needs grouped kv heads.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernel_testing

from graftjax.kernels import attention as attn

INTERPRET = kernel_testing.INTERPRET


def _kernel(**static):
  return kernel_testing.jitted(attn.attention, **static)


HEADS, KV_HEADS, HEAD_DIM = 4, 1, 256
CAPACITY = 128
BLOCK_K = 32  # 4 KV tiles over the capacity
WINDOW = 24
TOLERANCE = {
    jnp.float32: dict(rtol=2e-5, atol=2e-5),
    jnp.bfloat16: dict(rtol=2e-2, atol=2e-2),
}


def _run(q, k, v, q_pos, k_pos, **static):
  static = dict(dict(block_k=BLOCK_K, window=None), **static)
  out = _kernel(**static)(q, k, v, jnp.asarray(q_pos), jnp.asarray(k_pos))
  return np.asarray(out.astype(jnp.float32))


def _normal(rng, shape, dtype, scale=1.0):
  return jnp.asarray(rng.standard_normal(shape) * scale, dtype)


def _garbage(rng, shape, dtype):
  """Large finite numbers of both signs."""
  return jnp.asarray(rng.choice([-3e30, 3e30, -7.0e4, 1e4], size=shape), dtype)


@pytest.mark.parametrize(
    'dtype,window,kv_heads,batch,num_q',
    [
        # K = 1 cases share their compiled shapes with the invariance test.
        (jnp.float32, None, 1, 8, 7),
        (jnp.bfloat16, WINDOW, 1, 8, 7),
        # Grouped kv heads (G = 2) and two query blocks, the last one padded.
        (jnp.float32, WINDOW, 2, 2, 20),
    ],
)
def test_matches_reference(dtype, window, kv_heads, batch, num_q):
  rng = np.random.default_rng(0)
  q = _normal(rng, (batch, num_q, HEADS, HEAD_DIM), dtype, HEAD_DIM**-0.5)
  k = _normal(rng, (batch, CAPACITY, kv_heads, HEAD_DIM), dtype)
  v = _normal(rng, (batch, CAPACITY, kv_heads, HEAD_DIM), dtype)
  # Each row: a cache of some tokens in shuffled slots with holes (written
  # slots at -1), queries at the latest positions, one query unplaced.
  k_pos = np.full((batch, CAPACITY), -1, np.int32)
  q_pos = np.zeros((batch, num_q), np.int32)
  for b in range(batch):
    filled = int(rng.integers(num_q + 10, CAPACITY + 1))
    k_pos[b, :filled] = rng.permutation(filled)
    k_pos[b, rng.choice(filled, filled // 8, replace=False)] = -1
    q_pos[b] = np.arange(filled - num_q, filled)
  q_pos[1, 3] = -1  # sees nothing
  out = _run(q, k, v, q_pos, k_pos, window=window)
  ref = np.asarray(
      attn.attention_reference(
          q, k, v, jnp.asarray(q_pos), jnp.asarray(k_pos), window=window
      ).astype(jnp.float32)
  )
  assert np.isfinite(out).all()
  np.testing.assert_allclose(out, ref, **TOLERANCE[dtype])
  np.testing.assert_array_equal(out[1, 3], 0.0)
  assert np.abs(out).max() > 0.1


def _cache_case(tokens_k, tokens_v, filled, garbage_seed, dtype):
  """A [1, S, K, H] cache whose first `filled` slots hold tokens 0..filled-1."""
  junk = np.random.default_rng(garbage_seed)
  rest = (CAPACITY - filled, KV_HEADS, HEAD_DIM)
  k = jnp.concatenate([tokens_k[:filled], _garbage(junk, rest, dtype)])[None]
  v = jnp.concatenate([tokens_v[:filled], _garbage(junk, rest, dtype)])[None]
  k_pos = np.full((1, CAPACITY), -1, np.int32)
  k_pos[0, :filled] = np.arange(filled)
  return k, v, k_pos


@pytest.mark.parametrize('dtype,window', [(jnp.float32, None),
                                          (jnp.bfloat16, WINDOW)])
def test_row_bits_do_not_depend_on_chunk_batch_or_history(dtype, window):
  """A query row gives the same bits alone, in a chunk of 7 or 64, at batch 1
  or 8, whether its prefix was written with it or restored from pieces, and
  whatever the empty slots hold."""
  rng = np.random.default_rng(1)
  prefix, chunk = 40, 64  # prompt 0..39, continuation 40..103
  total = prefix + chunk
  tok_q = _normal(rng, (total, HEADS, HEAD_DIM), dtype, HEAD_DIM**-0.5)
  tok_k = _normal(rng, (total, KV_HEADS, HEAD_DIM), dtype)
  tok_v = _normal(rng, (total, KV_HEADS, HEAD_DIM), dtype)
  kwargs = dict(window=window)

  # Fresh: the 64-token continuation written in one call; the cache slots are
  # written with dynamic_update_slice into zeros (empty slots stay zero).
  k64 = jax.lax.dynamic_update_slice(
      jnp.zeros((1, CAPACITY, KV_HEADS, HEAD_DIM), dtype), tok_k[None],
      (0, 0, 0, 0))
  v64 = jax.lax.dynamic_update_slice(
      jnp.zeros((1, CAPACITY, KV_HEADS, HEAD_DIM), dtype), tok_v[None],
      (0, 0, 0, 0))
  kp64 = np.full((1, CAPACITY), -1, np.int32)
  kp64[0, :total] = np.arange(total)
  qp64 = np.arange(prefix, total, dtype=np.int32)[None]
  out64 = _run(tok_q[None, prefix:], k64, v64, qp64, kp64, **kwargs)

  # Grafted: the prompt restored (a separate array concatenated in), then a
  # chunk of 7 (positions 47..53) written; garbage beyond.
  lo, hi = 47, 54
  k7, v7, kp7 = _cache_case(tok_k, tok_v, hi, garbage_seed=2, dtype=dtype)
  restored_k = jnp.asarray(np.asarray(tok_k[:prefix]))  # a fresh buffer
  k7 = k7.at[0, :prefix].set(restored_k)
  qp7 = np.arange(lo, hi, dtype=np.int32)[None]
  out7 = _run(tok_q[None, lo:hi], k7, v7, qp7, kp7, **kwargs)

  # One token alone (position 50), other garbage in the empty slots.
  target = 50
  k1, v1, kp1 = _cache_case(tok_k, tok_v, target + 1, garbage_seed=3,
                            dtype=dtype)
  out1 = _run(tok_q[None, target:target + 1], k1, v1,
              np.array([[target]], np.int32), kp1, **kwargs)

  # Batch 8: the chunk of 7 in batch row 5, unrelated rows around it.
  batch = 8
  kb = _normal(rng, (batch, CAPACITY, KV_HEADS, HEAD_DIM), dtype)
  vb = _normal(rng, (batch, CAPACITY, KV_HEADS, HEAD_DIM), dtype)
  qb = _normal(rng, (batch, hi - lo, HEADS, HEAD_DIM), dtype, HEAD_DIM**-0.5)
  kpb = np.tile(np.arange(CAPACITY, dtype=np.int32), (batch, 1))
  qpb = np.tile(np.arange(100, 107, dtype=np.int32), (batch, 1))
  kb, vb = kb.at[5].set(k7[0]), vb.at[5].set(v7[0])
  qb = qb.at[5].set(tok_q[lo:hi])
  kpb[5], qpb[5] = kp7[0], qp7[0]
  out_b8 = _run(qb, kb, vb, qpb, kpb, **kwargs)

  # Same rows, same bits.
  np.testing.assert_array_equal(out7[0], out64[0, lo - prefix:hi - prefix])
  np.testing.assert_array_equal(out_b8[5], out7[0])
  np.testing.assert_array_equal(out1[0, 0], out64[0, target - prefix])
  if dtype == jnp.float32:  # (one dtype is enough; saves a compile)
    # Walking only the tiles a program may see is only a speed knob.
    out7_all_tiles = _run(tok_q[None, lo:hi], k7, v7, qp7, kp7,
                          skip_masked_tiles=False, **kwargs)
    np.testing.assert_array_equal(out7_all_tiles, out7)
  # ...and the common rows are right, not merely consistent.
  ref = attn.attention_reference(
      tok_q[None, prefix:], k64, v64, jnp.asarray(qp64), jnp.asarray(kp64),
      window=window)
  np.testing.assert_allclose(out64, np.asarray(ref.astype(jnp.float32)),
                             **TOLERANCE[dtype])


def test_empty_slot_contents_do_not_matter():
  rng = np.random.default_rng(4)
  dtype = jnp.float32
  q = _normal(rng, (1, 7, HEADS, HEAD_DIM), dtype, HEAD_DIM**-0.5)
  tok_k = _normal(rng, (CAPACITY, KV_HEADS, HEAD_DIM), dtype)
  tok_v = _normal(rng, (CAPACITY, KV_HEADS, HEAD_DIM), dtype)
  q_pos = np.arange(40, 47, dtype=np.int32)[None]
  outs = []
  for seed in (10, 11):
    k, v, k_pos = _cache_case(tok_k, tok_v, 47, seed, dtype)
    # Hide every third written slot too: its (real) contents must not count.
    k_pos[0, ::3] = -1
    outs.append(_run(q, k, v, q_pos, k_pos))
  zeros_k = jnp.where(jnp.arange(CAPACITY)[None, :, None, None] < 47,
                      k, 0.0)
  zeros_v = jnp.where(jnp.arange(CAPACITY)[None, :, None, None] < 47,
                      v, 0.0)
  zeros_k = zeros_k.at[0, ::3].set(0.0)
  zeros_v = zeros_v.at[0, ::3].set(0.0)
  outs.append(_run(q, zeros_k, zeros_v, q_pos, k_pos))
  assert np.isfinite(outs[0]).all()
  np.testing.assert_array_equal(outs[0], outs[1])
  np.testing.assert_array_equal(outs[0], outs[2])


def test_window_equals_emptying_out_of_window_slots():
  """window=W gives the bits of a cache whose slots at p - W or older are
  empty; and it does change the result."""
  rng = np.random.default_rng(5)
  dtype = jnp.float32
  q = _normal(rng, (1, 7, HEADS, HEAD_DIM), dtype, HEAD_DIM**-0.5)
  k = _normal(rng, (1, CAPACITY, KV_HEADS, HEAD_DIM), dtype)
  v = _normal(rng, (1, CAPACITY, KV_HEADS, HEAD_DIM), dtype)
  k_pos = np.arange(CAPACITY, dtype=np.int32)[None]
  windowed = _run(q, k, v, np.arange(60, 67, dtype=np.int32)[None], k_pos,
                  window=WINDOW)
  plain = _run(q, k, v, np.arange(60, 67, dtype=np.int32)[None], k_pos)
  assert not np.array_equal(windowed, plain)
  for t, p in enumerate(range(60, 67)):
    trimmed = np.where(p - k_pos < WINDOW, k_pos, -1)
    alone = _run(q[:, t:t + 1], k, v, np.array([[p]], np.int32), trimmed)
    np.testing.assert_array_equal(alone[0, 0], windowed[0, t])


def test_rows_that_see_nothing_are_zero():
  rng = np.random.default_rng(6)
  dtype = jnp.float32
  q = _normal(rng, (1, 7, HEADS, HEAD_DIM), dtype)
  k = _garbage(rng, (1, CAPACITY, KV_HEADS, HEAD_DIM), dtype)
  v = _garbage(rng, (1, CAPACITY, KV_HEADS, HEAD_DIM), dtype)
  # Keys only at positions >= 100; queries before that, or unplaced (-1).
  k_pos = np.where(np.arange(CAPACITY) < 20, 100 + np.arange(CAPACITY), -1)
  k_pos = k_pos.astype(np.int32)[None]
  q_pos = np.array([[-1, 0, 5, 50, 99, -1, 3]], np.int32)
  out = _run(q, k, v, q_pos, k_pos)
  np.testing.assert_array_equal(out, 0.0)
  ref = attn.attention_reference(q, k, v, jnp.asarray(q_pos),
                                 jnp.asarray(k_pos))
  np.testing.assert_array_equal(np.asarray(ref), 0.0)


@pytest.mark.parametrize('window', [None, 5])
def test_tile_ranges_cover_every_visible_tile(window):
  rng = np.random.default_rng(7)
  batch, num_q, block_q, block_k = 3, 32, 8, 16
  k_pos = rng.integers(-1, 100, (batch, CAPACITY)).astype(np.int32)
  q_pos = rng.integers(-1, 100, (batch, num_q)).astype(np.int32)
  q_pos[0] = np.arange(60, 60 + num_q)
  k_pos[0] = np.where(np.arange(CAPACITY) < 92, np.arange(CAPACITY), -1)
  ranges = np.asarray(attn.tile_ranges(
      jnp.asarray(q_pos), jnp.asarray(k_pos), window=window,
      block_q=block_q, block_k=block_k))
  assert ranges.shape == (batch, num_q // block_q, 2)
  vis = np.asarray(attn.visible(q_pos[:, :, None], k_pos[:, None, :], window))
  vis = vis.reshape(batch, num_q // block_q, block_q, -1, block_k)
  vis = vis.any(axis=(2, 4))  # [B, query blocks, tiles]
  for b in range(batch):
    for i in range(num_q // block_q):
      lo, hi = ranges[b, i]
      seen = np.flatnonzero(vis[b, i])
      assert 0 <= lo <= hi <= CAPACITY // block_k
      if seen.size:
        assert lo <= seen[0] and seen[-1] < hi
  # Sorted causal cache: a block walks only the tiles up to its positions.
  if window is None:
    np.testing.assert_array_equal(ranges[0, :, 1], [5, 5, 6, 6])
  else:
    np.testing.assert_array_equal(ranges[0, :, 0], [3, 4, 4, 5])


@pytest.mark.parametrize(
    'shapes,kwargs,match',
    [
        (((1, 4, 4, 256), (1, 100, 1, 256)), {}, 'multiple of block_k'),
        (((1, 4, 3, 256), (1, 128, 2, 256)), {}, 'multiple of kv heads'),
        (((1, 4, 4, 256), (1, 128, 1, 128)), {}, 'head dim'),
        (((1, 4, 4, 256), (1, 128, 1, 256)), {'window': 0}, 'window'),
    ],
)
def test_shape_errors(shapes, kwargs, match):
  q_shape, k_shape = shapes
  q = jnp.zeros(q_shape, jnp.float32)
  k = jnp.zeros(k_shape, jnp.float32)
  with pytest.raises(ValueError, match=match):
    attn.attention(q, k, k, jnp.zeros(q_shape[:2], jnp.int32),
                   jnp.zeros(k_shape[:2], jnp.int32), block_k=64,
                   interpret=INTERPRET, **kwargs)
