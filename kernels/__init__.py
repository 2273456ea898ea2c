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

Import the module you need (`from graftjax.kernels import attention`); this
package imports nothing eagerly.
"""
