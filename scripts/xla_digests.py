"""SHA-256 digests of the model's `xla` path, its Pallas path and the kernels.

A refactor of the ops must leave these bits alone: run before and after and
compare the two outputs line by line (digests are per machine, not committed).

  .venv/bin/python scripts/xla_digests.py > /tmp/before.txt
  .venv/bin/python scripts/xla_digests.py > /tmp/after.txt && diff /tmp/before.txt /tmp/after.txt

Sections: `tiny/xla` (every position scheme, sliding window, block-attention
segments, float32 and bfloat16, chunked prefill and decode, key relocation),
`tiny/pallas` (the same on the kernels, interpreted on CPU), `kernel` (each
kernel in interpret mode on random operands) and `real` (gemma-3-270m,
float32 and bfloat16, `logits='all'`; needs the GGUF package).
"""

from __future__ import annotations

import hashlib

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

# Everything is imported up front, so that edits made while this runs (the
# `before` half of a refactor) cannot leak into it through lazy imports.
from graftjax.kernels import attention
from graftjax.kernels import matmul
from graftjax.kernels import rmsnorm
from graftjax.kernels import rotary
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import positions
from graftjax.models.gemma import schemes
from graftjax.models.gemma import tokenizer  # noqa: F401  (model.load imports it)

_SECTIONS = flags.DEFINE_list(
  'sections', ['tiny_xla', 'tiny_pallas', 'kernel', 'real'], 'which digests to print'
)

DTYPES = (jnp.float32, jnp.bfloat16)
CAPACITY = 64
PROMPTS = ('The capital of France is', 'def fibonacci(n):', '1, 2, 3, 5, 8, 13,')


def digest(x) -> str:
  x = np.asarray(x)
  return hashlib.sha256(x.tobytes()).hexdigest() + f' {x.dtype}{list(x.shape)}'


def _tiny_lines(impl: str):
  """Prefill in chunks, a block-attention segment, decode, relocation."""
  rng = np.random.default_rng(7)
  ids = rng.integers(3, 256, 21).astype(np.int32)  # > 2 sliding windows of 8
  block = rng.integers(3, 256, 6).astype(np.int32)
  for scheme in schemes.names():
    # The interpreted kernels compile slowly: bfloat16 and grouped kv heads
    # only for `rope` there (the `kernel` section covers every variant).
    quick = impl == 'pallas' and scheme != 'rope'
    for dtype in DTYPES[:1] if quick else DTYPES:
      for kv_heads in (1, 2) if dtype == jnp.float32 and not quick else (1,):
        name = f'tiny/{impl}/{scheme}/{jnp.dtype(dtype).name}/kv{kv_heads}'
        m = gemma_model.tiny(dtype=dtype, position_scheme=scheme, impl=impl, num_kv_heads=kv_heads)
        logits, cache = m.prefill(
          ids, cache=m.init_cache(capacity=CAPACITY), chunk_size=7, logits='all'
        )
        yield f'{name}/prefill', digest(logits)
        # A block in its own segment, then a query chunk in segment 0 over both.
        seg_logits, cache = m.prefill(
          block, cache=cache, chunk_size=3, start_position=ids.size, logits='all', segment=1
        )
        yield f'{name}/segment1', digest(seg_logits)
        tok = np.asarray([[int(np.argmax(np.asarray(seg_logits)[0, -1]))]], np.int32)
        pos = ids.size + block.size
        for step in range(3):
          out, cache = m.forward(tok, np.full((1, 1), pos + step, np.int32), cache, logits='last')
          yield f'{name}/decode{step}', digest(out)
          tok = np.asarray([[int(np.argmax(np.asarray(out)[0]))]], np.int32)
        yield f'{name}/cache_k', digest(cache.k)
        if impl == 'xla' and kv_heads == 1:
          yield f'{name}/relocate_keys', digest(m.relocate_keys(cache.k[:, 0, :8], 37))
    if quick:
      continue
    # Two rows with different contents in one call.
    m = gemma_model.tiny(position_scheme=scheme, impl=impl)
    two = np.stack([ids[:7], ids[5:12]])
    cache = m.init_cache(batch_size=2, capacity=CAPACITY)
    out, _ = m.forward(two, np.stack([np.arange(7)] * 2), cache)
    yield f'tiny/{impl}/{scheme}/float32/batch2', digest(out)


def _kernel_lines():
  """Each kernel (interpret mode) and each reference on fixed random operands."""
  rng = np.random.default_rng(3)
  for dtype in DTYPES:
    name = jnp.dtype(dtype).name
    b, t, n, kh, h, s = 2, 7, 4, 2, 16, 128
    q = jnp.asarray(rng.normal(size=(b, t, n, h)), dtype)
    k = jnp.asarray(rng.normal(size=(b, s, kh, h)), dtype)
    v = jnp.asarray(rng.normal(size=(b, s, kh, h)), dtype)
    k_pos = np.full((b, s), -1, np.int32)
    k_pos[:, :40] = np.arange(40)
    k_pos[1, 40:47] = np.arange(40, 47)
    q_pos = np.stack([np.arange(33, 40), np.arange(40, 47)]).astype(np.int32)
    q_seg = np.zeros((b, t), np.int32)
    q_seg[0, 3:] = 1
    k_seg = np.zeros((b, s), np.int32)
    k_seg[0, 20:40] = 1
    table = positions.table(h, 10_000.0, 256)
    variants = {
      'plain': {},
      'window': {'window': 8},
      'segments': {'q_segments': jnp.asarray(q_seg), 'k_segments': jnp.asarray(k_seg)},
      'alibi': {'distance_bias': positions.bias_table(schemes.ALIBI, n, 256)},
      'relative': {'relative_table': (table['cos'], table['sin'])},
    }
    args = (q, k, v, jnp.asarray(q_pos), jnp.asarray(k_pos))
    for variant, kw in variants.items():
      yield (
        f'kernel/attention/{variant}/{name}',
        digest(attention.attention(*args, interpret=True, **kw)),
      )
      yield (
        f'reference/attention/{variant}/{name}',
        digest(attention.attention_reference(*args, **kw)),
      )
    x = jnp.asarray(rng.normal(size=(3, 40)), dtype)
    w = jnp.asarray(1 + 0.1 * rng.normal(size=(40,)), dtype)
    yield f'kernel/rms_norm/{name}', digest(rmsnorm.rms_norm(x, w, interpret=True))
    yield f'reference/rms_norm/{name}', digest(rmsnorm.rms_norm_reference(x, w))
    xr = jnp.asarray(rng.normal(size=(2, 5, 3, 16)), dtype)
    pr = jnp.asarray(rng.integers(0, 5000, (2, 5)), jnp.int32)
    yield f'kernel/rotary/{name}', digest(rotary.apply_rotary(xr, pr, theta=1e4, interpret=True))
    yield f'reference/rotary/{name}', digest(rotary.apply_rotary_reference(xr, pr, theta=1e4))
    xm = jnp.asarray(rng.normal(size=(5, 64)), dtype)
    wm = jnp.asarray(rng.normal(size=(64, 128)), dtype)
    yield f'kernel/matmul/{name}', digest(matmul.matmul(xm, wm, interpret=True))
    yield f'reference/matmul/{name}', digest(matmul.matmul_reference(xm, wm))


def _real_lines():
  for dtype in DTYPES:
    m = gemma_model.load('gemma3-270m', dtype=dtype)
    for i, prompt in enumerate(PROMPTS):
      ids = [2] + m.tokenizer.encode(prompt)
      logits, _ = m.prefill(ids, cache=m.init_cache(capacity=64), chunk_size=8, logits='all')
      yield f'real/xla/{jnp.dtype(dtype).name}/prompt{i}', digest(logits)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  print(f'# jax {jax.__version__} {jax.default_backend()}', flush=True)
  producers = {
    'tiny_xla': lambda: _tiny_lines('xla'),
    'tiny_pallas': lambda: _tiny_lines('pallas'),
    'kernel': _kernel_lines,
    'real': _real_lines,
  }
  for section in _SECTIONS.value:
    for name, value in producers[section]():
      print(f'{name} {value}', flush=True)


if __name__ == '__main__':
  app.run(main)
