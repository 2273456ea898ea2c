"""graftjax.kernels.attention: against the reference, and bit-invariance.

Runs the kernel natively on GPU and in the Pallas interpreter elsewhere.
Shapes are small; head shapes are gemma-3-270m's (N=4, K=1, H=256) unless a
test needs grouped kv heads. The optional variants (segments, a distance
bias, rotary from distances) run at H=32 over S=64 slots.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernel_testing

from graftjax.kernels import attention as attn
from graftjax.kernels import dots
from graftjax.kernels import rotary

INTERPRET = kernel_testing.INTERPRET


def _kernel(**static):
  return kernel_testing.jitted(attn.attention, **static)


HEADS, KV_HEADS, HEAD_DIM = 4, 1, 256
CAPACITY = 128
BLOCK_K = 16  # 8 KV tiles over the capacity...
BLOCK_S = 32  # ...in 4 splits of 2 tiles
WINDOW = 24
TOLERANCE = {
  jnp.float32: dict(rtol=2e-5, atol=2e-5),
  jnp.bfloat16: dict(rtol=2e-2, atol=2e-2),
}
# float32 with 'bf16x3' dots (about 16 bits of each operand), against IEEE float32.
SPLIT_TOLERANCE = dict(rtol=2e-4, atol=2e-4)


def _sizes(dtype, group):
  """The default tile sizes of (dtype, G) with small KV tiles and splits."""
  return dataclasses.replace(
    attn.default_block_sizes(dtype, group), block_k=BLOCK_K, block_s=BLOCK_S
  )


def _run(q, k, v, q_pos, k_pos, options=None, combine=None, **static):
  """The kernel's output in float32; `options` are its optional array operands,
  `combine` replaces the combine's block sizes (combine_group, combine_block_h)."""
  sizes = dataclasses.replace(_sizes(q.dtype, q.shape[2] // k.shape[2]), **(combine or {}))
  static = dict(dict(block_sizes=sizes, window=None), **static)
  out = _kernel(**static)(q, k, v, jnp.asarray(q_pos), jnp.asarray(k_pos), **(options or {}))
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
    attn.attention_reference(q, k, v, jnp.asarray(q_pos), jnp.asarray(k_pos), window=window).astype(
      jnp.float32
    )
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


@pytest.mark.parametrize(
  'dtype,window,precision,combine',
  [
    (jnp.float32, None, 'highest', {}),
    (jnp.bfloat16, WINDOW, 'highest', {}),
    (jnp.float32, None, 'bf16x3', {}),
    (jnp.float32, None, 'highest', dict(combine_group=1)),
    (jnp.float32, None, 'highest', dict(combine_group=2)),
  ],
)
@pytest.mark.slow
def test_row_bits_do_not_depend_on_chunk_batch_or_history(dtype, window, precision, combine):
  """A query row gives the same bits alone, in a chunk of 7 or 64, at batch 1
  or 8, whether its prefix was written with it or restored from pieces, in a
  cache of either capacity, and whatever the empty slots hold; also with float32 dots split into bfloat16
  pieces (`dots`), and with the combine's splits summed one by one or in pairs."""
  rng = np.random.default_rng(1)
  prefix, chunk = 40, 64  # prompt 0..39, continuation 40..103
  total = prefix + chunk
  tok_q = _normal(rng, (total, HEADS, HEAD_DIM), dtype, HEAD_DIM**-0.5)
  tok_k = _normal(rng, (total, KV_HEADS, HEAD_DIM), dtype)
  tok_v = _normal(rng, (total, KV_HEADS, HEAD_DIM), dtype)
  kwargs = dict(window=window, precision=dots.from_name(precision), combine=combine)

  # Fresh: the 64-token continuation written in one call; the cache slots are
  # written with dynamic_update_slice into zeros (empty slots stay zero).
  k64 = jax.lax.dynamic_update_slice(
    jnp.zeros((1, CAPACITY, KV_HEADS, HEAD_DIM), dtype), tok_k[None], (0, 0, 0, 0)
  )
  v64 = jax.lax.dynamic_update_slice(
    jnp.zeros((1, CAPACITY, KV_HEADS, HEAD_DIM), dtype), tok_v[None], (0, 0, 0, 0)
  )
  kp64 = np.full((1, CAPACITY), -1, np.int32)
  kp64[0, :total] = np.arange(total)
  qp64 = np.arange(prefix, total, dtype=np.int32)[None]
  out64 = _run(tok_q[None, prefix:], k64, v64, qp64, kp64, **kwargs)

  # The same cache twice as large (slots past 128 empty, holding garbage):
  # the combine walks more splits, and the rows' last ones see 4 of them.
  junk = np.random.default_rng(6)
  rest = (1, CAPACITY, KV_HEADS, HEAD_DIM)
  k_big = jnp.concatenate([k64, _garbage(junk, rest, dtype)], axis=1)
  v_big = jnp.concatenate([v64, _garbage(junk, rest, dtype)], axis=1)
  kp_big = np.concatenate([kp64, np.full((1, CAPACITY), -1, np.int32)], axis=1)
  out_big = _run(tok_q[None, prefix:], k_big, v_big, qp64, kp_big, **kwargs)

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
  k1, v1, kp1 = _cache_case(tok_k, tok_v, target + 1, garbage_seed=3, dtype=dtype)
  out1 = _run(
    tok_q[None, target : target + 1], k1, v1, np.array([[target]], np.int32), kp1, **kwargs
  )

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
  np.testing.assert_array_equal(out_big, out64)
  np.testing.assert_array_equal(out7[0], out64[0, lo - prefix : hi - prefix])
  np.testing.assert_array_equal(out_b8[5], out7[0])
  np.testing.assert_array_equal(out1[0, 0], out64[0, target - prefix])
  if dtype == jnp.float32 and precision == 'highest' and not combine:  # (one case is enough)
    # Walking only the tiles a program may see is only a speed knob.
    out7_all_tiles = _run(tok_q[None, lo:hi], k7, v7, qp7, kp7, skip_masked_tiles=False, **kwargs)
    np.testing.assert_array_equal(out7_all_tiles, out7)
    # Nor do query slices (each block's rows are independent).
    out64_sliced = _run(
      tok_q[None, prefix:],
      k64,
      v64,
      qp64,
      kp64,
      max_query_tokens=_sizes(dtype, HEADS).block_q,
      **kwargs,
    )
    np.testing.assert_array_equal(out64_sliced, out64)
    # Nor, when the combine adds one split at a time, its head dims per program.
    one_by_one = dict(kwargs, combine=dict(combine_group=1))
    np.testing.assert_array_equal(
      _run(tok_q[None, lo:hi], k7, v7, qp7, kp7, **one_by_one),
      _run(
        tok_q[None, lo:hi],
        k7,
        v7,
        qp7,
        kp7,
        **dict(one_by_one, combine=dict(combine_group=1, combine_block_h=HEAD_DIM)),
      ),
    )
  # ...and the common rows are right, not merely consistent.
  ref = attn.attention_reference(
    tok_q[None, prefix:], k64, v64, jnp.asarray(qp64), jnp.asarray(kp64), window=window
  )
  tolerance = TOLERANCE[dtype] if precision == 'highest' else SPLIT_TOLERANCE
  np.testing.assert_allclose(out64, np.asarray(ref.astype(jnp.float32)), **tolerance)


@pytest.mark.slow
@pytest.mark.parametrize('group', [1, 2, 4, 8])
def test_combine_groups_stay_close_to_the_reference(group):
  """The combine's sum by groups of splits (4 live here; 8 walks padding it
  never reads) is as close to the reference as the ascending sum."""
  rng = np.random.default_rng(5)
  q = _normal(rng, (1, 1, HEADS, HEAD_DIM), jnp.float32, HEAD_DIM**-0.5)
  k = _normal(rng, (1, CAPACITY, KV_HEADS, HEAD_DIM), jnp.float32)
  v = _normal(rng, (1, CAPACITY, KV_HEADS, HEAD_DIM), jnp.float32)
  q_pos = np.array([[CAPACITY - 1]], np.int32)  # sees all 4 splits
  k_pos = np.arange(CAPACITY, dtype=np.int32)[None]
  got = _run(q, k, v, q_pos, k_pos, combine=dict(combine_group=group))
  ref = attn.attention_reference(q, k, v, jnp.asarray(q_pos), jnp.asarray(k_pos))
  np.testing.assert_allclose(got, np.asarray(ref), **TOLERANCE[jnp.float32])


@pytest.mark.slow
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
  zeros_k = jnp.where(jnp.arange(CAPACITY)[None, :, None, None] < 47, k, 0.0)
  zeros_v = jnp.where(jnp.arange(CAPACITY)[None, :, None, None] < 47, v, 0.0)
  zeros_k = zeros_k.at[0, ::3].set(0.0)
  zeros_v = zeros_v.at[0, ::3].set(0.0)
  outs.append(_run(q, zeros_k, zeros_v, q_pos, k_pos))
  assert np.isfinite(outs[0]).all()
  np.testing.assert_array_equal(outs[0], outs[1])
  np.testing.assert_array_equal(outs[0], outs[2])


@pytest.mark.slow
def test_window_equals_emptying_out_of_window_slots():
  """window=W gives the bits of a cache whose slots at p - W or older are
  empty; and it does change the result."""
  rng = np.random.default_rng(5)
  dtype = jnp.float32
  q = _normal(rng, (1, 7, HEADS, HEAD_DIM), dtype, HEAD_DIM**-0.5)
  k = _normal(rng, (1, CAPACITY, KV_HEADS, HEAD_DIM), dtype)
  v = _normal(rng, (1, CAPACITY, KV_HEADS, HEAD_DIM), dtype)
  k_pos = np.arange(CAPACITY, dtype=np.int32)[None]
  windowed = _run(q, k, v, np.arange(60, 67, dtype=np.int32)[None], k_pos, window=WINDOW)
  plain = _run(q, k, v, np.arange(60, 67, dtype=np.int32)[None], k_pos)
  assert not np.array_equal(windowed, plain)
  for t, p in enumerate(range(60, 67)):
    trimmed = np.where(p - k_pos < WINDOW, k_pos, -1)
    alone = _run(q[:, t : t + 1], k, v, np.array([[p]], np.int32), trimmed)
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
  ref = attn.attention_reference(q, k, v, jnp.asarray(q_pos), jnp.asarray(k_pos))
  np.testing.assert_array_equal(np.asarray(ref), 0.0)


# The optional variants: block-attention segments, a distance bias (ALiBi's
# linear one, or a log bias), and rotary scores from distances (un-rotated q
# and k, a cos/sin table indexed by q_pos - k_pos). Small heads: H=32 is two
# block_h steps of the relative score.
VARIANTS = ('segments', 'alibi', 'log_bias', 'relative')
VAR_DIM = 32
VAR_CAPACITY = 64
TABLE_SIZE = 128  # > every distance in these caches
THETA = 10_000.0


def _segment_of(positions):
  """Segment of the token at each position (0 for an empty slot): 0, 1 or 2."""
  return jnp.asarray(np.where(positions >= 0, positions // 5 % 3, 0), jnp.int32)


def _slopes(num_heads):
  return 2.0 ** (-8.0 * np.arange(1, num_heads + 1) / num_heads)  # float64


def _alibi_table(num_heads):
  """[N, TABLE_SIZE] float32: -slope[n] * d."""
  return jnp.asarray(-_slopes(num_heads)[:, None] * np.arange(TABLE_SIZE), jnp.float32)


def _log_table(num_heads):
  """[N, TABLE_SIZE] float32: -r1[n] * log(1 + r2[n] * d), a KERPLE-log bias."""
  r1, r2 = 1.0 + np.arange(num_heads), 0.5 ** np.arange(num_heads)
  return jnp.asarray(-r1[:, None] * np.log1p(r2[:, None] * np.arange(TABLE_SIZE)), jnp.float32)


def _inverse_frequencies(head_dim):
  return THETA ** -(np.arange(0, head_dim, 2) / head_dim)  # float64


def _distance_table(head_dim):
  """(cos, sin) [TABLE_SIZE, H/2] of distance * inverse frequency, in float64."""
  return tuple(jnp.asarray(t) for t in rotary.rotary_table(head_dim, THETA, np.arange(TABLE_SIZE)))


def _options(variant, q_pos, k_pos):
  """The optional operands of `variant` ('all': every one) for these tokens."""
  options = {}
  if variant in ('segments', 'all'):
    options.update(q_segments=_segment_of(q_pos), k_segments=_segment_of(k_pos))
  if variant in ('alibi', 'all'):
    options.update(distance_bias=_alibi_table(HEADS))
  if variant == 'log_bias':
    options.update(distance_bias=_log_table(HEADS))
  if variant in ('relative', 'all'):
    options.update(relative_table=_distance_table(VAR_DIM))
  return options


def _shuffled_cache(rng, batch, num_q):
  """Slot positions [B, S]: tokens in shuffled slots with holes; queries [B, T]
  at the latest positions, query (1, 3) unplaced."""
  k_pos = np.full((batch, VAR_CAPACITY), -1, np.int32)
  q_pos = np.zeros((batch, num_q), np.int32)
  for b in range(batch):
    filled = int(rng.integers(num_q + 10, VAR_CAPACITY + 1))
    k_pos[b, :filled] = rng.permutation(filled)
    k_pos[b, rng.choice(filled, filled // 8, replace=False)] = -1
    q_pos[b] = np.arange(filled - num_q, filled)
  q_pos[1, 3] = -1
  return q_pos, k_pos


@pytest.mark.parametrize(
  'variant,dtype,window,kv_heads',
  [
    ('segments', jnp.float32, WINDOW, 2),
    ('segments', jnp.bfloat16, None, 1),
    ('alibi', jnp.float32, None, 1),
    ('alibi', jnp.bfloat16, WINDOW, 2),
    ('log_bias', jnp.float32, WINDOW, 2),
    ('relative', jnp.float32, WINDOW, 2),
    ('relative', jnp.bfloat16, None, 1),
    ('all', jnp.float32, WINDOW, 2),
  ],
)
@pytest.mark.slow
def test_variants_match_reference(variant, dtype, window, kv_heads):
  rng = np.random.default_rng(12)
  batch, num_q = 2, 20
  q = _normal(rng, (batch, num_q, HEADS, VAR_DIM), dtype, VAR_DIM**-0.5)
  k = _normal(rng, (batch, VAR_CAPACITY, kv_heads, VAR_DIM), dtype)
  v = _normal(rng, (batch, VAR_CAPACITY, kv_heads, VAR_DIM), dtype)
  q_pos, k_pos = _shuffled_cache(rng, batch, num_q)
  options = _options(variant, q_pos, k_pos)
  out = _run(q, k, v, q_pos, k_pos, options, window=window)
  ref = np.asarray(
    attn.attention_reference(
      q, k, v, jnp.asarray(q_pos), jnp.asarray(k_pos), window=window, **options
    ).astype(jnp.float32)
  )
  assert np.isfinite(out).all()
  np.testing.assert_allclose(out, ref, **TOLERANCE[dtype])
  np.testing.assert_array_equal(out[1, 3], 0.0)
  assert np.abs(out).max() > 0.1
  if variant != 'segments':  # the option does change the result
    plain = attn.attention_reference(q, k, v, jnp.asarray(q_pos), jnp.asarray(k_pos), window=window)
    assert np.abs(np.asarray(plain.astype(jnp.float32)) - ref).max() > 0.01


def test_reference_variants_follow_their_definitions():
  """The reference with every option equals, in float64, rotary attention of
  q and k rotated by their absolute positions, plus the bias table at each
  distance,
  masked by causality, window and segments."""
  rng = np.random.default_rng(13)
  batch, num_q, window = 2, 20, WINDOW
  q = _normal(rng, (batch, num_q, HEADS, VAR_DIM), jnp.float32, VAR_DIM**-0.5)
  k = _normal(rng, (batch, VAR_CAPACITY, 1, VAR_DIM), jnp.float32)
  v = _normal(rng, (batch, VAR_CAPACITY, 1, VAR_DIM), jnp.float32)
  q_pos, k_pos = _shuffled_cache(rng, batch, num_q)
  options = _options('all', q_pos, k_pos)
  ref = attn.attention_reference(
    q, k, v, jnp.asarray(q_pos), jnp.asarray(k_pos), window=window, **options
  )

  def rotated(x, positions):  # [B, L, n, H] by positions [B, L], NEOX
    angles = positions[:, :, None, None] * _inverse_frequencies(VAR_DIM)
    x1, x2 = np.split(np.asarray(x, np.float64), 2, axis=-1)
    cos, sin = np.cos(angles), np.sin(angles)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

  scores = np.einsum('BTNH,BSH->BNTS', rotated(q, q_pos), rotated(k, k_pos)[:, :, 0])
  distance = q_pos[:, :, None] - k_pos[:, None, :]
  bias = np.asarray(options['distance_bias'], np.float64)  # [N, D]
  scores += bias[:, np.clip(distance, 0, TABLE_SIZE - 1)].transpose(1, 0, 2, 3)
  q_seg = np.asarray(options['q_segments'])[:, :, None]
  k_seg = np.asarray(options['k_segments'])[:, None, :]
  seen = (
    (k_pos[:, None, :] >= 0)
    & (distance >= 0)
    & (distance < window)
    & ((q_seg == 0) | (q_seg == k_seg))
  )[:, None]
  scores = np.where(seen, scores, -np.inf)
  top = np.max(scores, axis=-1, keepdims=True)
  weights = np.where(seen, np.exp(scores - np.where(seen.any(-1, keepdims=True), top, 0.0)), 0.0)
  weights /= np.maximum(weights.sum(-1, keepdims=True), 1e-300)
  want = np.einsum('BNTS,BSH->BTNH', weights, np.asarray(v, np.float64)[:, :, 0])
  np.testing.assert_allclose(np.asarray(ref), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
  'variant,dtype,window,kv_heads',
  [
    ('segments', jnp.float32, WINDOW, 1),
    ('alibi', jnp.bfloat16, None, 2),
    ('log_bias', jnp.float32, None, 2),
    ('relative', jnp.float32, WINDOW, 2),
  ],
)
@pytest.mark.slow
def test_variant_row_bits_depend_only_on_the_row_and_distances(variant, dtype, window, kv_heads):
  """A query row gives the same bits alone, in a chunk of 7 or of 20, with
  garbage in the empty slots; and, every position moved by M, the same bits
  again (segments, slopes and table entries follow the tokens)."""
  rng = np.random.default_rng(14)
  prefix, chunk = 20, 20  # prompt 0..19, continuation 20..39
  total = prefix + chunk
  tok_q = _normal(rng, (total, HEADS, VAR_DIM), dtype, VAR_DIM**-0.5)
  tok_k = _normal(rng, (total, kv_heads, VAR_DIM), dtype)
  tok_v = _normal(rng, (total, kv_heads, VAR_DIM), dtype)

  def case(first, last, garbage_seed, shift=0):
    """Queries first..last-1 over slots 0..last-1 holding tokens 0..last-1."""
    junk = np.random.default_rng(garbage_seed)
    rest = (VAR_CAPACITY - last, kv_heads, VAR_DIM)
    k = jnp.concatenate([tok_k[:last], _garbage(junk, rest, dtype)])[None]
    v = jnp.concatenate([tok_v[:last], _garbage(junk, rest, dtype)])[None]
    k_pos = np.full((1, VAR_CAPACITY), -1, np.int32)
    k_pos[0, :last] = np.arange(last)
    q_pos = np.arange(first, last, dtype=np.int32)[None]
    options = _options(variant, q_pos, k_pos)
    moved = np.where(k_pos >= 0, k_pos + shift, -1)
    return _run(tok_q[None, first:last], k, v, q_pos + shift, moved, options, window=window)[0]

  out20 = case(prefix, total, garbage_seed=2)
  out7 = case(27, 34, garbage_seed=3)
  out1 = case(30, 31, garbage_seed=4)
  moved = case(prefix, total, garbage_seed=5, shift=1000)
  np.testing.assert_array_equal(out7, out20[27 - prefix : 34 - prefix])
  np.testing.assert_array_equal(out1[0], out20[30 - prefix])
  np.testing.assert_array_equal(moved, out20)


@pytest.mark.slow
@pytest.mark.parametrize('window', [None, 5])
def test_tile_ranges_cover_every_visible_tile(window):
  rng = np.random.default_rng(7)
  batch, num_q, block_q, block_k = 3, 32, 8, 16
  k_pos = rng.integers(-1, 100, (batch, CAPACITY)).astype(np.int32)
  q_pos = rng.integers(-1, 100, (batch, num_q)).astype(np.int32)
  q_pos[0] = np.arange(60, 60 + num_q)
  k_pos[0] = np.where(np.arange(CAPACITY) < 92, np.arange(CAPACITY), -1)
  ranges = np.asarray(
    attn.tile_ranges(
      jnp.asarray(q_pos), jnp.asarray(k_pos), window=window, block_q=block_q, block_k=block_k
    )
  )
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
    (((1, 4, 4, 256), (1, 128, 1, 256)), {'q_segments': jnp.zeros((1, 4), jnp.int32)}, 'together'),
    (
      ((1, 4, 4, 256), (1, 128, 1, 256)),
      {'q_segments': jnp.zeros((1, 4), jnp.int32), 'k_segments': jnp.zeros((1, 64), jnp.int32)},
      r'k_segments \(1, 64\)',
    ),
    (
      ((1, 4, 4, 256), (1, 128, 1, 256)),
      {'distance_bias': jnp.zeros((1, 64), jnp.float32)},
      r'distance_bias \(1, 64\) must be \[N, D\] with N=4',
    ),
    (
      ((1, 4, 4, 256), (1, 128, 1, 256)),
      {'relative_table': (jnp.zeros((64, 256)), jnp.zeros((64, 256)))},
      'H/2=128',
    ),
    (
      ((1, 4, 4, 256), (1, 128, 1, 256)),
      {
        'relative_table': (jnp.zeros((64, 128)), jnp.zeros((64, 128))),
        'block_sizes': attn.BlockSizes(block_h=48),
      },
      'multiple of block_h=48',
    ),
    (
      ((1, 4, 4, 256), (1, 128, 1, 256)),
      {'block_sizes': attn.BlockSizes(block_k=64, block_s=96)},
      'block_s=96 must be a multiple of block_k=64',
    ),
    (((1, 4, 4, 256), (1, 128, 1, 256)), {'max_query_tokens': 2}, 'must be at least block_q'),
    (
      ((1, 4, 4, 256), (1, 128, 1, 256)),
      {'block_sizes': attn.BlockSizes(block_k=64, combine_group=0)},
      'combine_group=0 must be a positive power of 2',
    ),
    (
      ((1, 4, 4, 256), (1, 128, 1, 256)),
      {'block_sizes': attn.BlockSizes(block_k=64, combine_group=3)},
      'combine_group=3 must be a positive power of 2',
    ),
    (
      ((1, 4, 4, 256), (1, 128, 1, 256)),
      {'block_sizes': attn.BlockSizes(block_k=64, combine_block_h=48)},
      'divide the head dim H=256',
    ),
  ],
)
def test_shape_errors(shapes, kwargs, match):
  q_shape, k_shape = shapes
  q = jnp.zeros(q_shape, jnp.float32)
  k = jnp.zeros(k_shape, jnp.float32)
  kwargs = dict(dict(block_sizes=attn.BlockSizes(block_k=64)), **kwargs)
  with pytest.raises(ValueError, match=match):
    attn.attention(
      q,
      k,
      k,
      jnp.zeros(q_shape[:2], jnp.int32),
      jnp.zeros(k_shape[:2], jnp.int32),
      interpret=INTERPRET,
      **kwargs,
    )


def test_default_block_sizes_follow_dtype_and_grouping():
  f32 = attn.default_block_sizes(jnp.float32, 4)
  assert f32.block_q * 4 == attn.default_block_sizes(jnp.bfloat16, 2).block_q * 2
  assert f32 != attn.default_block_sizes(jnp.bfloat16, 4)
  with pytest.raises(ValueError, match='no default block sizes for int8'):
    attn.default_block_sizes(jnp.int8, 4)
  with pytest.raises(ValueError, match='must be positive'):
    attn.default_block_sizes(jnp.float32, 0)
