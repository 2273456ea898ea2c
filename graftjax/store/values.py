"""What a stored block's keys and values must hold: finite numbers only.

One NaN or infinity in a row of v that no query attends to still turns every logit
NaN (softmax weights of 0 times NaN are NaN), so `put` refuses a block holding one
and `verify` reports a stored one.
"""

from __future__ import annotations

import numpy as np

from graftjax.store import chunks as store_chunks

# The exponent bits of each k/v dtype: all of them set is an infinity or a NaN.
_EXPONENT = {'float32': (np.uint32, 0x7F800000), 'bfloat16': (np.uint16, 0x7F80)}


def first_nonfinite(arrays: dict[str, np.ndarray]) -> str | None:
  """'name[i, j, ...] is value' for the first NaN or infinity of the layered arrays
  (k, v [L, n, K, H], and a page's tails) in `arrays`, or None if all are finite.

  Each layer is looked at on its own thread (numpy releases the GIL).
  """
  layers = [
    (name, i)
    for name, array in arrays.items()
    if name in store_chunks.LAYERED
    for i in range(array.shape[0])
  ]
  found = store_chunks.map_threads(lambda item: _first_in(arrays[item[0]][item[1]]), layers)
  for (name, layer), index in zip(layers, found):
    if index is not None:
      where = (layer, *index)
      value = arrays[name][where]
      return f'{name}[{", ".join(map(str, where))}] is {value}'
  return None


def _first_in(layer: np.ndarray) -> tuple[int, ...] | None:
  """The index of the first non-finite value of a C-contiguous float32/bfloat16 array."""
  bits_dtype, mask = _EXPONENT[layer.dtype.name]
  bits = np.ascontiguousarray(layer).view(np.dtype(bits_dtype).newbyteorder(layer.dtype.byteorder))
  bad = (bits & mask) == mask
  if not bad.any():
    return None
  return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), layer.shape))
