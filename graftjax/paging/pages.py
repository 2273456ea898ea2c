"""Pages: a block cut to the rows some later query can see, exact by construction.

Details and the exactness argument: docs/paging.md, section `graftjax/paging/pages.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.models import cache as cache_lib
from graftjax.models import target as target_lib
from graftjax.models.gemma import config as config_lib

Layout = tuple[tuple[int, int], ...]


PageError = blocks.PageError


def windows(config: config_lib.GemmaConfig) -> tuple[int | None, ...]:
  """W of each layer of `config` that caches keys and values (a block's layers), None for a
  global layer (what `blocks.check_page` takes)."""
  return tuple(config.window(layer) for layer in config.cached_layers)


def local_rows_needed(config: config_lib.GemmaConfig) -> int:
  """W - 1 for the widest local layer: the rows the query right after a block sees."""
  windows = [config.window(layer) for layer in range(config.num_layers)]
  return max((w - 1 for w in windows if w is not None), default=0)


def page_layout(
  config: config_lib.GemmaConfig, n: int, *, local_rows: int | None = None
) -> Layout | None:
  """(first_row, stop_row) per layer for a block of n rows, or None to keep every row.

  Global layers keep [0, n); local layers the last `local_rows` (default W - 1).
  None when nothing would be dropped (n <= local_rows, or no local layer).
  """
  r = local_rows_needed(config) if local_rows is None else local_rows
  if not 0 <= r:
    raise ValueError(f'local_rows must be >= 0, got {r}')
  if r >= n or all(config.window(i) is None for i in range(config.num_layers)):
    return None
  return tuple(
    (0, n) if config.window(layer) is None else (n - r, n) for layer in range(config.num_layers)
  )


@dataclasses.dataclass(frozen=True)
class Page:
  """A block and the rows of it that are kept: one form with blocks.

  Attributes:
    block: the block. A compact block (layout 4) holds only the rows it keeps
      (its tail layers' last `tail_rows`); a page of block layout 3 read from a
      store holds zeros in the rows its `layout` does not keep.
    layout: for a page of block layout 3, (first_row, stop_row) per layer;
      None otherwise (a compact block records its rows in its metadata).
  """

  block: blocks.KVBlock
  layout: Layout | None

  @property
  def rows(self) -> Layout:
    """(first_row, stop_row) of the rows kept of each cached layer."""
    return self.layout if self.layout is not None else self.block.layout

  @property
  def local_rows(self) -> int | None:
    """Rows kept of the trimmed layers (None: none trimmed)."""
    first = max(first for first, _ in self.rows)
    return len(self.block) - first if first else None

  @property
  def end_position(self) -> int:
    """e: the position just after the block's last token."""
    meta = self.block.meta
    return meta.first_position + meta.shift + len(self.block)

  def first_exact_position(self, config: config_lib.GemmaConfig) -> int:
    """The smallest query position for which this page attends as the full block does."""
    return blocks.page_exact_from(self.block, self.rows, windows(config))

  def nbytes(self) -> int:
    """Bytes of k, v and positions that the page keeps (its payload on disk)."""
    return payload_bytes(self.block, self.layout)


def payload_bytes(block: blocks.KVBlock, layout: Layout | None) -> int:
  """Bytes of the rows `layout` keeps of `block` (k, v and int32 positions); a compact
  block's own bytes (`layout` None)."""
  if block.meta.compact:
    return block.nbytes()
  _, n, kv_heads, head_dim = block.k.shape
  row = kv_heads * head_dim * jnp.dtype(block.k.dtype).itemsize
  rows = block.k.shape[0] * n if layout is None else sum(stop - first for first, stop in layout)
  return 2 * rows * row + 4 * n


def to_page(
  block: blocks.KVBlock, config: config_lib.GemmaConfig, *, local_rows: int | None = None
) -> Page:
  """`block` as a page: global layers whole, local layers' last `local_rows` (default W - 1).

  A compact block is cut to a tail of `local_rows` (a block of layout 4 again, its own key);
  one of layout 3 keeps its rows, zeroed where not kept, under a page layout."""
  _check_layers(block, config)
  if block.meta.compact:
    return Page(block=_cut_tail(block, config, local_rows), layout=None)
  layout = page_layout(config, len(block), local_rows=local_rows)
  if layout is None:
    return Page(block=block, layout=None)
  k, v = np.array(block.k), np.array(block.v)  # host copies, zeroed where not kept
  for layer, (first, _) in enumerate(layout):
    k[layer, :first] = 0
    v[layer, :first] = 0
  return Page(
    block=blocks.KVBlock(k=k, v=v, positions=block.positions, meta=block.meta), layout=layout
  )


def check_page(page: Page, config: config_lib.GemmaConfig, *, query_position: int | None) -> None:
  """Raises PageError unless `page` is exact for `config` and a query at `query_position`.

  Every global layer must be whole; the trimmed layers must be local; and
  with fewer than W - 1 local rows, `query_position` must be given and at
  least `first_exact_position` (`blocks.check_page`, which `restore` uses too).
  """
  blocks.check_page(page.block, page.rows, windows(config), query_position=query_position)


def install(
  cache: cache_lib.KVCache,
  page: Page,
  *,
  target: target_lib.GraftTarget,
  config: config_lib.GemmaConfig,
  query_position: int | None = None,
  **graft_kwargs: Any,
) -> cache_lib.KVCache:
  """`cache` with `page` grafted in at its slots (zeros for the rows not kept).

  Checks the page against `config` (`check_page`) and then `blocks.graft`
  checks it against `target` and `cache`, all before the cache is touched.
  `graft_kwargs`: chunk_size (the prefill chunk size in force), allow_shifted,
  allow_other_shape, donate (as `blocks.graft`).
  """
  check_page(page, config, query_position=query_position)
  return blocks.graft(
    cache, page.block, target=target, query_position=query_position, **graft_kwargs
  )


def put(store: store_lib.BlockStore, page: Page) -> str:
  """Stores `page` (only the rows it keeps) and returns its key."""
  return store.put(page.block, page_layout=page.layout)


def get(store: store_lib.BlockStore, key: str) -> Page:
  """The page (or plain block) under `key`, every byte verified."""
  block, layout = store.get_page(key)
  return Page(block=block, layout=layout)


def page_in(
  store: store_lib.BlockStore,
  key: str,
  cache: cache_lib.KVCache,
  *,
  target: target_lib.GraftTarget,
  config: config_lib.GemmaConfig,
  query_position: int | None = None,
  **graft_kwargs: Any,
) -> cache_lib.KVCache:
  """Read, verify and install the page under `key` (the cache untouched on any error)."""
  return install(
    cache,
    get(store, key),
    target=target,
    config=config,
    query_position=query_position,
    **graft_kwargs,
  )


def bytes_per_token(
  config: config_lib.GemmaConfig, dtype: str, n: int | None = None, *, local_rows: int | None = None
) -> dict[str, float]:
  """K/V bytes per token of a block and of its page, from the config alone.

  With n None: the asymptote (global layers only for a page). With n: a
  block of n tokens, the page's fixed local tail spread over its tokens.
  Positions (4 B/token, both formats) are left out, as llama.cpp's count does.
  """
  row = 2 * config.num_kv_heads * config.head_dim * np.dtype(jnp.dtype(dtype)).itemsize
  num_global = sum(config.window(i) is None for i in range(config.num_layers))
  num_local = config.num_layers - num_global
  r = local_rows_needed(config) if local_rows is None else local_rows
  block = config.num_layers * row
  if n is None:
    page = num_global * row
  else:
    page = (num_global * n + num_local * min(r, n)) * row / n
  return {'block': float(block), 'page': float(page), 'ratio': block / page}


def spans(n_tokens: int, body: int, overlap: int = 0) -> list[tuple[int, int]]:
  """[begin, end) of each page cutting `n_tokens` text tokens into pages of `body` tokens.

  Pages start every `body - overlap` tokens; the last one is moved back to end at
  `n_tokens`, so every page holds `body` tokens (one page if `n_tokens <= body`). Any run
  of at most `overlap + 1` consecutive tokens lies whole inside some page: a fact that
  short is never cut by a boundary. Stored tokens grow by about body / (body - overlap).
  """
  if not 0 <= overlap < body:
    raise ValueError(f'need 0 <= overlap < body, got overlap {overlap}, body {body}')
  if n_tokens <= body:
    return [(0, n_tokens)]
  starts = [*range(0, n_tokens - body, body - overlap), n_tokens - body]
  return [(begin, begin + body) for begin in starts]


def cut(
  token_ids: Sequence[int], page_tokens: int, *, overlap: int = 0, bos: int
) -> tuple[np.ndarray, list[tuple[int, int]]]:
  """Text tokens cut into pages: ([P, page_tokens] ids, BOS then the span's tokens; spans).

  `spans(len(token_ids), page_tokens - 1, overlap)` says which tokens each page holds.
  Each page is prefilled alone from slot 0, so installing it is exact by construction.
  """
  ids = np.asarray(token_ids, np.int32)
  if len(ids) < page_tokens - 1:
    raise ValueError(f'{len(ids)} tokens do not fill one page of {page_tokens - 1} text tokens')
  cuts = spans(len(ids), page_tokens - 1, overlap)
  rows = [np.concatenate([[bos], ids[begin:end]]) for begin, end in cuts]
  return np.asarray(rows, np.int32), cuts


def _check_layers(block: blocks.KVBlock, config: config_lib.GemmaConfig) -> None:
  layers, cached = block.num_layers, len(config.cached_layers)
  if layers != cached:
    raise PageError(f'block has {layers} layers, the model {cached}')


def _cut_tail(
  block: blocks.KVBlock, config: config_lib.GemmaConfig, local_rows: int | None
) -> blocks.KVBlock:
  """A compact block with its tail cut to its last `local_rows` rows (default W - 1)."""
  r = local_rows_needed(config) if local_rows is None else local_rows
  if r < 0:
    raise ValueError(f'local_rows must be >= 0, got {r}')
  meta = block.meta
  if not meta.tail_layers or r >= meta.tail_rows:
    return block
  tails = {'k_tail': None, 'v_tail': None}
  if r:
    tails = {name: getattr(block, name)[:, meta.tail_rows - r :] for name in tails}
  return block.replace(meta=dataclasses.replace(meta, tail_rows=r), **tails)
