"""KERPLE-log, a distance-bias position scheme added from outside the library.

  bias[n, d] = -r1[n] * log(1 + r2[n] * d),   d = query position - key position

(Chi et al., "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation", NeurIPS 2022; r1, r2 > 0 are learned per head there, fixed
per head here.) Keys are cached as projected and the bias depends on the
distance alone, so a block moved to another offset and grafted gives the
bits of a fresh computation there. docs/positions.md walks through it;
tests/models/gemma/test_positions_example.py runs it.

    python docs/examples/kerple_log.py
"""

from __future__ import annotations

import numpy as np

from graftjax.models.gemma import schemes


def kerple_log_bias(distance: np.ndarray, num_heads: int) -> np.ndarray:
  """[N, D] float32: -r1[n] log(1 + r2[n] d), in float64 on the host, rounded once."""
  heads = np.arange(num_heads, dtype=np.float64)
  r1 = 1.0 + heads  # 1, 2, 3, ...: stronger locality on later heads
  r2 = 0.5**heads  # 1, 1/2, 1/4, ...: slower decay on later heads
  d = np.asarray(distance, np.float64)
  return (-r1[:, None] * np.log1p(r2[:, None] * d[None, :])).astype(np.float32)


KERPLE_LOG = schemes.Scheme(
  name='kerple_log',
  keys=schemes.Keys.PLAIN,
  relocation_exact=True,
  bias=kerple_log_bias,
  summary='no rotation; a log distance bias -r1 log(1 + r2 d) per head (KERPLE-log)',
)


def register() -> schemes.Scheme:
  """Registers KERPLE_LOG (again: a no-op); returns it."""
  return schemes.register(KERPLE_LOG)


def main() -> None:
  """A block computed at offset 0, moved to 4096 and grafted, against fresh at 4096."""
  from graftjax.models.gemma import model as gemma_model  # pylint: disable=g-import-not-at-top
  from graftjax.studies.position import relocation  # pylint: disable=g-import-not-at-top

  register()
  block, continuation = list(range(10, 22)), list(range(40, 44))
  layout = relocation.Layout(capacity=64, chunk_size=4)
  for impl in ('xla', 'pallas'):
    model = gemma_model.tiny(position_scheme='kerple_log', impl=impl)
    fresh = relocation.fresh_at(model, block, continuation, 4096, layout)
    grafted = relocation.relocated_to(model, block, continuation, 4096, layout)
    same = fresh.tobytes() == grafted.tobytes()
    print(f'{impl}: grafted at 4096 == fresh at 4096, byte for byte: {same}')


if __name__ == '__main__':
  main()
