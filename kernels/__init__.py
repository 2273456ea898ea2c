"""Deterministic, chunk-invariant Pallas kernels (graftjax.kernels).

One op per module, each with block sizes, kernel, jitted wrapper and a
pure-jnp `*_reference`:

  attention   attention(q, k, v, q_positions, k_positions, *, window, ...)
              (kernels in attention_split, attention_combine; the
              reference, which the model's xla path runs, in
              attention_reference)
  rotary      apply_rotary(x, positions, *, theta, ...), rotary_inv_freq
  rmsnorm     rms_norm(x, w, *, eps, ...)
  matmul      matmul(x, w, *, block_m, block_n, block_k, precision, ...)
  matmul_decode  matmul_decode(x, w, *, block_n, transposed, ...): 1-16
              rows with matmul's contraction (its reference is matmul's)
  matmul_tiles   which matmul kernel and tiles a call takes (`dense`)

`registry` maps each op's implementation names ('xla', 'pallas',
attention's 'xla_split', and any registered) to callables of one signature:
the model calls `registry.get(op, name).fn` (docs/kernels.md).

Import the module you need (`from graftjax.kernels import attention`); this
package imports nothing eagerly.
"""
