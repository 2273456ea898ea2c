"""The block the restore probes read: gemma-3-270m's k/v shape, float32, random values."""

import numpy as np

from graftjax import blocks
from graftjax import store as store_lib


def put(store: store_lib.BlockStore, n: int, rng: np.random.Generator) -> str:
  """Stores a block of `n` tokens (18 layers, 1 kv head of 256; v = -k) for a cache of
  n + 1024 slots; returns its key."""
  meta = blocks.BlockMeta(
    model_fingerprint='0' * 64,
    token_ids=tuple(int(t) for t in rng.integers(3, 9999, n)),
    start=0,
    dtype='float32',
    position_scheme='rope',
    capacity=n + 1024,
  )
  k = rng.standard_normal((18, n, 1, 256), dtype=np.float32)
  return store.put(blocks.KVBlock(meta=meta, k=k, v=-k, positions=np.arange(n, dtype=np.int32)))
