"""`restore`: read a stored block, verify it, check it and graft it, in one call.

Apart from blocks.py because it needs the store, and the store needs blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.models import cache as cache_lib
from graftjax.models import target as target_lib


def restore(
  store: store_lib.BlockStore,
  key: str,
  cache: cache_lib.KVCache,
  *,
  target: target_lib.GraftTarget,
  token_ids: Sequence[int] | None = None,
  allow_shifted: bool = False,
  allow_other_shape: bool = False,
  donate: bool = False,
) -> cache_lib.KVCache:
  """`cache` with the block stored under `key` grafted in (see `blocks.graft`).

  The store checks every chunk's SHA-256 and that the manifest describes
  `key`; `graft` then checks the block against `target` and `cache`. All of
  it happens before the cache is touched, so on any error `cache` is left as
  it was, even with `donate=True`.

  Args:
    store: where the block is.
    key: its content key (`store.put`'s return value).
    cache: the cache to graft into.
    target: the model's `graft_target`.
    token_ids: if given, the tokens the caller expects the block to hold.
    allow_shifted, allow_other_shape, donate: as for `blocks.graft`.

  Raises:
    store.StoreError: if the block is missing or does not verify.
    blocks.GraftError: if it holds other tokens than `token_ids`, or
      `graft` refuses it.
  """
  block = store.get(key)
  if token_ids is not None and tuple(int(t) for t in token_ids) != block.meta.token_ids:
    raise blocks.GraftError(f'block {key[:12]}… holds other tokens than the ones asked for')
  return blocks.graft(
    cache,
    block,
    target=target,
    allow_shifted=allow_shifted,
    allow_other_shape=allow_other_shape,
    donate=donate,
  )
