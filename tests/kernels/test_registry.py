"""graftjax.kernels.registry: names to implementations, declarations checked, the built-ins'
bits those of the kernels and references they call."""

import jax.numpy as jnp
import numpy as np
import pytest

import kernel_testing

from graftjax.kernels import attention
from graftjax.kernels import attention_reference
from graftjax.kernels import attention_xla_split
from graftjax.kernels import dots
from graftjax.kernels import matmul_tiles
from graftjax.kernels import registry
from graftjax.kernels import rmsnorm
from graftjax.kernels import rotary

BUILTIN_NAMES = {
  'attention': ('xla', 'pallas', 'xla_split'),
  'matmul': ('xla', 'pallas'),
  'norm': ('xla', 'pallas'),
  'rotary': ('xla', 'pallas'),
}


def _same_bytes(a, b) -> bool:
  a, b = np.asarray(a), np.asarray(b)
  return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_every_op_has_its_builtin_implementations():
  assert {op: registry.names(op) for op in registry.OPS} == BUILTIN_NAMES
  for op, names in BUILTIN_NAMES.items():
    for name in names:
      impl = registry.get(op, name)
      assert (impl.op, impl.name) == (op, name) and callable(impl.fn) and impl.summary


def test_declared_facts_of_the_builtins():
  chunk = {(i.op, i.name) for i in registry.BUILTIN if i.chunk_invariant}
  split = {(i.op, i.name) for i in registry.BUILTIN if i.split_invariant}
  assert chunk == {(op, 'pallas') for op in registry.OPS}
  assert split == {('attention', 'pallas'), ('attention', 'xla_split')}


def test_an_unknown_name_is_refused_with_the_registered_ones():
  with pytest.raises(registry.UnknownImplementationError) as refused:
    registry.get('attention', 'cuda')
  message = str(refused.value)
  assert "'cuda'" in message and all(repr(n) in message for n in BUILTIN_NAMES['attention'])
  with pytest.raises(
    registry.UnknownImplementationError, match="matmul implementation 'xla_split'"
  ):
    registry.get('matmul', 'xla_split')
  with pytest.raises(registry.UnknownImplementationError, match="unknown op 'softmax'"):
    registry.get('softmax', 'xla')
  with pytest.raises(registry.UnknownImplementationError, match="unknown op 'softmax'"):
    registry.names('softmax')
  assert isinstance(refused.value, ValueError)


def test_register_and_unregister():
  impl = registry.Implementation('attention', 'test_copy', registry.attention_xla, summary='x')
  assert registry.register(impl) is impl
  try:
    assert registry.register(impl) is impl  # again: a no-op
    assert registry.get('attention', 'test_copy') is impl
    assert registry.names('attention')[-1] == 'test_copy'
    other = registry.Implementation('attention', 'test_copy', registry.attention_pallas)
    with pytest.raises(registry.ImplementationDeclarationError, match='already registered'):
      registry.register(other)
  finally:
    registry.unregister('attention', 'test_copy')
  assert registry.names('attention') == BUILTIN_NAMES['attention']
  with pytest.raises(registry.UnknownImplementationError):
    registry.unregister('attention', 'test_copy')


@pytest.mark.parametrize(
  ('impl', 'why'),
  [
    (registry.Implementation('softmax', 'xla', registry.matmul_xla), 'unknown op'),
    (registry.Implementation('matmul', 'my-matmul', registry.matmul_xla), 'identifier'),
    (registry.Implementation('matmul', '', registry.matmul_xla), 'identifier'),
    (registry.Implementation('norm', 'mine', 'not a function'), 'callable'),
    (
      registry.Implementation('matmul', 'mine', registry.matmul_xla, split_invariant=True),
      'attention declaration',
    ),
    (registry.Implementation('attention', 'xla', registry.attention_pallas), 'already registered'),
  ],
)
def test_contradicting_declarations_are_refused(impl, why):
  with pytest.raises(registry.ImplementationDeclarationError, match=why):
    registry.register(impl)
  assert {op: registry.names(op) for op in registry.OPS} == BUILTIN_NAMES


# --------------------------------------------------------- the built-ins call what they name


def _attention_operands(dtype=jnp.float32):
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((1, 4, 4, 16)) * 0.3, dtype)  # [B, T, N, H], G = 4
  k = jnp.asarray(rng.standard_normal((1, 64, 1, 16)), dtype)  # [B, S, K, H]
  v = jnp.asarray(rng.standard_normal((1, 64, 1, 16)), dtype)
  k_positions = np.where(np.arange(64) < 40, np.arange(64), -1).astype(np.int32)[None]
  q_positions = np.arange(36, 40, dtype=np.int32)[None]
  return q, k, v, jnp.asarray(q_positions), jnp.asarray(k_positions)


@pytest.mark.parametrize('window', [None, 8])
def test_attention_adapters_give_the_bits_of_the_calls_they_replace(window):
  args = _attention_operands()
  precision = dots.from_name('highest')
  want_xla = attention_reference.attention_reference(
    *args, window=window, precision=precision, compute_dtype=None
  )
  block_s = attention.default_block_sizes(jnp.float32, 4).block_s
  want_split = attention_xla_split.attention_xla_split(
    *args, block_s=block_s, window=window, precision=precision
  )
  xla = registry.get('attention', 'xla').fn(*args, window, precision='highest')
  split = registry.get('attention', 'xla_split').fn(*args, window, precision='highest')
  assert _same_bytes(xla, want_xla) and _same_bytes(split, want_split)
  assert np.abs(np.asarray(xla)).max() > 0.1  # the rows saw keys
  # The adapters are not interchangeable: compute_dtype=None is what 'xla' means.
  float32_first = attention_reference.attention_reference(
    *(x.astype(jnp.bfloat16) if i < 3 else x for i, x in enumerate(args)),
    window=window,
    precision=precision,
  )
  bf16 = registry.get('attention', 'xla').fn(
    *(x.astype(jnp.bfloat16) if i < 3 else x for i, x in enumerate(args)),
    window,
    precision='highest',
  )
  assert not _same_bytes(bf16, float32_first)


def test_pallas_attention_adapter_gives_the_kernels_bits():
  args = _attention_operands()
  want = attention.attention(
    *args, window=8, precision=dots.from_name('highest'), interpret=kernel_testing.INTERPRET
  )
  got = registry.get('attention', 'pallas').fn(*args, 8, precision='highest')
  assert _same_bytes(got, want)


def test_matmul_norm_rotary_adapters():
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.standard_normal((1, 3, 32)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((32, 2, 16)) / 6, jnp.float32)
  table = jnp.asarray(rng.standard_normal((48, 32)) / 6, jnp.float32)
  matmul_xla = registry.get('matmul', 'xla').fn
  want = dots.einsum('...D,Dab->...ab', x, w, dots.from_name('highest'))
  assert _same_bytes(matmul_xla(x, w, precision='highest'), want)
  assert _same_bytes(
    matmul_xla(x, table, precision='highest', w_layout='nk'),
    matmul_xla(x, table.T, precision='highest'),
  )
  assert registry.get('matmul', 'pallas').fn is matmul_tiles.dense
  pallas = matmul_tiles.dense(x, w, precision='highest')
  np.testing.assert_allclose(pallas, want, rtol=1e-5, atol=1e-5)

  norm_w = jnp.asarray(rng.standard_normal(32), jnp.float32)
  assert _same_bytes(
    registry.get('norm', 'xla').fn(x, norm_w, eps=1e-6),
    rmsnorm.rms_norm_reference(x, norm_w, eps=1e-6),
  )

  q = jnp.asarray(rng.standard_normal((1, 3, 2, 16)), jnp.float32)
  positions = jnp.asarray([[5, 6, 70]], jnp.int32)
  inv_freq = rotary.rotary_inv_freq_float32(16, 1e4, 0.5) / jnp.float32(8.0)
  assert _same_bytes(
    registry.get('rotary', 'xla').fn(q, positions, theta=1e4, scale=8.0, fraction=0.5),
    rotary.apply_rotary_reference(q, positions, theta=1e4, inv_freq=inv_freq),
  )
