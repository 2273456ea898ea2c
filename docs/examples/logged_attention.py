"""An attention implementation added from outside the library: 'xla', logging what it attends over.

Registered under the name 'xla_logged', it computes exactly what 'xla' does
(the same function on the same arguments) and records, as the model is
traced, the shapes of each call's queries and keys and its window: one entry
per attention layer, so a sliding-window layer's ring and a global layer's
full cache can be read off. docs/kernels.md walks through it;
tests/models/gemma/test_attention_example.py runs it.

    python docs/examples/logged_attention.py
"""

from __future__ import annotations

import jax

from graftjax.kernels import registry
from graftjax.models.gemma import model as gemma_model

# (q [B, T, N, H], keys [B, S, K, H], window) of every call, appended when a call is traced.
CALLS: list[tuple[tuple[int, ...], tuple[int, ...], int | None]] = []


def logged_attention(
  q, k, v, q_positions, k_positions, window, *, precision: str, **optional
) -> jax.Array:
  """The 'xla' attention; records (q shape, k shape, window) in `CALLS` first."""
  CALLS.append((q.shape, k.shape, window))
  xla = registry.get('attention', 'xla').fn
  return xla(q, k, v, q_positions, k_positions, window, precision=precision, **optional)


XLA_LOGGED = registry.Implementation(
  op='attention',
  name='xla_logged',
  fn=logged_attention,
  summary="'xla', recording each traced call's shapes in CALLS",
)


def register() -> registry.Implementation:
  """Registers XLA_LOGGED (again: a no-op); returns it."""
  return registry.register(XLA_LOGGED)


def main() -> None:
  """The tiny model under 'xla_logged' against 'xla': the logits' bytes, and the calls."""
  register()
  xla = gemma_model.tiny().with_local_cache('ring', chunk_size=4)  # window-sized local rings
  logged = xla.with_impl('xla', attention='xla_logged')
  tokens = list(range(10, 30))
  want, _ = xla.prefill(tokens, cache=xla.init_cache(capacity=64), chunk_size=4, logits='all')
  got, _ = logged.prefill(tokens, cache=logged.init_cache(capacity=64), chunk_size=4, logits='all')
  same = jax.device_get(got).tobytes() == jax.device_get(want).tobytes()
  print(f"'xla_logged' logits == 'xla' logits, byte for byte: {same}")
  print(
    f'fingerprints differ (the name is part of the config): {logged.fingerprint != xla.fingerprint}'
  )
  for q_shape, k_shape, window in CALLS:
    print(f'  queries {q_shape} over keys {k_shape}, window {window}')


if __name__ == '__main__':
  main()
