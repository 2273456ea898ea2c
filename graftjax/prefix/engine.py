"""`Engine`: prefill and generate with the longest stored prefix of each prompt grafted in.

    engine = prefix.Engine(model, store, span=256, capacity=4096)
    out = engine.prefill(ids)          # out.logits [V], out.hit tokens reused
    out = engine.generate(ids, max_new_tokens=64)

A prefill syncs the span log (the entries after the last it read), looks the prompt
up (`index.PrefixIndex.lookup`, at most its first n - 1 tokens: the last is always
computed, for its logits), fetches the spans through the tiers, checks each against
the prompt (`spans.check`), grafts them at their own slots, prefills the rest in
chunks from the hit, and deposits the prompt's spans the store lacks.

Exactness: under chunk-invariant kernels (every op 'pallas') a row's bits do not
depend on the chunk, batch or capacity it was computed in, so the logits equal a cold
single-pass prefill byte for byte at every hit length. Under other kernels (XLA) they
do, so hits are rounded down to the prefill chunk grid, only rows computed in whole
chunks are deposited, and spans are keyed by capacity and chunk size
(`keys.domain_of`): the logits then equal a cold prefill on the same grid and
capacity, not a single-pass one. Anything that cannot be reused (a span missing,
corrupt, or not the prompt's) shortens the hit, with the reason recorded.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from graftjax import store as store_lib
from graftjax.models.gemma import sampler as sampler_lib
from graftjax.prefix import errors
from graftjax.prefix import index as index_lib
from graftjax.prefix import keys
from graftjax.prefix import log as log_lib
from graftjax.prefix import spans
from graftjax.prefix import tiers as tiers_lib


@dataclasses.dataclass
class Prefill:
  """What a prefill did.

  Attributes:
    logits: [V] float32 logits of the prompt's last token.
    cache: the cache holding the prompt (batch 1).
    length: the prompt's tokens n.
    hit: tokens grafted from stored spans (0 <= hit < n).
    found: the longest stored prefix found, before rounding and failures.
    steps: (start, rows, tier) of each span grafted.
    deposited: spans this prefill stored.
    read_bytes: bytes read from each tier, by name.
    reasons: why the hit is shorter than `found`, or why nothing was stored.
    seconds: from the call to the logits on the host (first-token time).
  """

  logits: np.ndarray
  cache: object
  length: int
  hit: int
  found: int
  steps: list[tuple[int, int, str]]
  deposited: int
  read_bytes: dict[str, int]
  reasons: list[str]
  seconds: float
  last_logits: object = dataclasses.field(default=None, repr=False)

  @property
  def recomputed(self) -> int:
    return self.length - self.hit


class Engine:
  """Automatic exact prefix reuse of one model over one `BlockStore`.

  Args:
    model: a `Gemma` whose sliding-window layers keep the full layout (`local_cache`
      'full'; a Gemma 4 keeps them in its ring arrays, never wrapping).
    store: the shared `BlockStore` (any driver); the span log lives under it.
    span: tokens per stored span S.
    capacity: cache slots (prompt plus generated tokens); a multiple of 64 under Pallas.
    chunk_size: prefill tokens per forward call.
    device_bytes, host_bytes, disk_bytes, store_bytes: byte budget of each tier
      (None: unbounded; 0: the tier keeps nothing).
    disk: a local directory for the disk tier (None: no disk tier).
  """

  def __init__(
    self,
    model,
    store: store_lib.BlockStore,
    *,
    span: int = 256,
    capacity: int = 4096,
    chunk_size: int = 256,
    device_bytes: int | None = None,
    host_bytes: int | None = None,
    disk: str | None = None,
    disk_bytes: int | None = None,
    store_bytes: int | None = None,
  ):
    if model.local_cache != 'full':
      raise errors.PrefixError(
        f'the model keeps a {model.local_cache!r} cache for its sliding-window layers: a span'
        " captured after a ring wrapped lacks rows; use with_local_cache('full')"
      )
    if span <= 0 or chunk_size <= 0 or capacity <= 0:
      raise errors.PrefixError(
        f'span, chunk_size and capacity must be positive, got {span}, {chunk_size}, {capacity}'
      )
    self.model, self.store = model, store
    self.span, self.capacity, self.chunk_size = span, capacity, chunk_size
    self.target = model.graft_target
    self.domain = keys.domain_of(self.target, capacity=capacity, chunk_size=chunk_size)
    self.index = index_lib.PrefixIndex(self.domain.digest, span)
    self.log = log_lib.SpanLog(spans.log_kvstore(store))
    tiers = [
      tiers_lib.MemoryTier('device', device_bytes, device=True),
      tiers_lib.MemoryTier('host', host_bytes, device=False),
    ]
    if disk is not None:
      tiers.append(tiers_lib.StoreTier('disk', store_lib.BlockStore(disk), disk_bytes))
    tiers.append(tiers_lib.StoreTier('store', store, store_bytes))
    self.tiers = tiers_lib.Tiers(tiers, on_drop_last=self._deleted)

  @property
  def exact_anywhere(self) -> bool:
    """Whether a hit may end at any token (chunk-invariant kernels), not only on the grid."""
    return self.domain.chunk_invariant

  def sync(self) -> int:
    """Reads the span log's new entries into the index; returns how many."""
    records = self.log.read_new()
    for record in records:
      self.index.take(record)
    return len(records)

  def prefill(self, token_ids, *, new_tokens: int = 0, deposit: bool = True, sync: bool = True):
    """Prefills one prompt [n] with its longest stored prefix reused (see the module).

    Args:
      token_ids: the prompt.
      new_tokens: tokens to be generated after it (they must fit the cache too).
      deposit: store the prompt's spans the store lacks.
      sync: read the span log's new entries first.
    Returns:
      A `Prefill`.
    Raises:
      PromptTooLongError: if the prompt and `new_tokens` do not fit the cache.
      PrefixError: for an empty prompt.
    """
    ids = self._checked(token_ids, new_tokens)
    began = time.perf_counter()
    if sync:
      self.sync()
    steps, found, reasons = self._lookup(ids)
    wanted = [tiers_lib.name(s.entry.key, b) for s in steps for b in s.entry.blocks]
    with self.tiers.pinned(wanted):
      before = dict(self.tiers.read_bytes)
      grafts, used = self._fetch(steps, ids, reasons)
      cache = self.model.init_cache(capacity=self.capacity)
      for block in grafts:
        cache = spans.graft(cache, block, target=self.target, chunk_size=self.chunk_size)
      hit = sum(len(b) for b in grafts)
      last, cache = self.model.prefill(
        ids[hit:], cache=cache, chunk_size=self.chunk_size, start_position=hit, logits='last'
      )
      logits = np.asarray(last[0])
      seconds = time.perf_counter() - began
      read = {name: self.tiers.read_bytes[name] - before[name] for name in before}
    deposited = self.deposit(ids, cache, reasons) if deposit else 0
    return Prefill(
      logits=logits,
      cache=cache,
      length=len(ids),
      hit=hit,
      found=found,
      steps=used,
      deposited=deposited,
      read_bytes=read,
      reasons=reasons,
      seconds=seconds,
      last_logits=last,
    )

  def prefill_many(self, prompts, *, deposit: bool = True) -> list[Prefill]:
    """Prefills prompts in order, one log sync for all: a prompt reuses the spans the
    earlier ones deposited, and a span fetched once stays on the device for the rest."""
    self.sync()
    return [self.prefill(p, deposit=deposit, sync=False) for p in prompts]

  def generate(
    self,
    token_ids,
    *,
    max_new_tokens: int,
    sampling: sampler_lib.SamplingConfig = sampler_lib.SamplingConfig(),
    rng: jax.Array | None = None,
    stop_ids: tuple[int, ...] | None = None,
    keep_logits: bool = False,
    deposit: bool = True,
  ) -> dict:
    """Prefills the prompt (as `prefill`), then decodes as `sampler.generate` does.

    Under chunk-invariant kernels the decoded tokens' rows are deposited too (a decode
    step computes the bits a prefill would), so the next turn of a conversation reuses
    its answer. Returns a dict with 'tokens', 'logits' if asked, and 'prefill'.
    """
    ids = self._checked(token_ids, max_new_tokens)
    pre = self.prefill(ids, new_tokens=max_new_tokens, deposit=deposit)
    config = self.model.config
    if stop_ids is None:
      stop_ids = tuple(t for t in (config.eos_id, config.end_of_turn_id) if t is not None)
    tokens, logits, steps, cache = sampler_lib.decode(
      self.model.params,
      pre.last_logits,
      jnp.full((1,), len(ids), jnp.int32),
      pre.cache,
      rng if rng is not None else jax.random.key(0),
      config=config,
      max_new_tokens=max_new_tokens,
      sampling=sampling,
      stop_ids=tuple(stop_ids),
      keep_logits=keep_logits,
      tables=self.model.tables,
    )
    n = int(steps)
    out_tokens = [int(t) for t in np.asarray(tokens)[0, :n]]
    pre.cache = None  # decode took its buffers
    if deposit and self.exact_anywhere and n > 1:
      # The cache holds the prompt and every generated token but the last.
      pre.deposited += self.deposit(np.concatenate([ids, out_tokens[:-1]]), cache, pre.reasons)
    out = {'tokens': out_tokens, 'prefill': pre}
    if keep_logits:
      out['logits'] = np.asarray(logits)[0, :n]
    return out

  def deposit(self, ids: np.ndarray, cache, reasons: list[str]) -> int:
    """Stores the spans of `ids` (held at slots [0, n) of `cache`) the index lacks; returns
    how many. Under kernels that are not chunk-invariant only rows of whole chunks."""
    stop = len(ids) if self.exact_anywhere else len(ids) // self.chunk_size * self.chunk_size
    parent, stored = keys.ROOT, 0
    for start in range(0, stop, self.span):
      tokens = ids[start : min(start + self.span, stop)]
      key = self.index.key(parent, tokens)
      if key not in self.index.entries:
        block = spans.capture(cache, start, tokens, target=self.target, chunk_size=self.chunk_size)
        content = spans.content_key(block)
        if not self.tiers.put(tiers_lib.name(key, content), block):
          reasons.append(f'span at {start} not stored: no tier budget takes its bytes')
          return stored
        entry = index_lib.Entry(key, parent, start, tuple(int(t) for t in tokens), [])
        _, others = self.log.append(entry.record(content, self.domain.digest))
        for record in others:
          self.index.take(record)
        self.index.add(entry, content)
        stored += 1
      parent = key
    return stored

  def _checked(self, token_ids, new_tokens: int) -> np.ndarray:
    ids = np.asarray(token_ids, np.int32).reshape(-1)
    if ids.size == 0:
      raise errors.PrefixError('nothing to prefill: empty token ids')
    if ids.size + new_tokens > self.capacity:
      raise errors.PromptTooLongError(
        f'prompt of {ids.size} tokens + {new_tokens} new ones exceeds the cache of'
        f' {self.capacity} slots'
      )
    return ids

  def _lookup(self, ids: np.ndarray) -> tuple[list[index_lib.Step], int, list[str]]:
    """(steps, stored prefix found, reasons) of the longest usable stored prefix."""
    reasons = []
    steps = self.index.lookup(ids, len(ids) - 1)
    found = sum(s.rows for s in steps)
    if not steps and self.index.foreign and not self.index.entries:
      reasons.append(
        f'the store holds {self.index.foreign} span records of other models or kernels only'
      )
    usable = []
    for step in steps:
      if step.rows < len(step.entry.token_ids) and not spans.keeps_every_row(
        self.model, len(step.entry.token_ids)
      ):
        reasons.append(
          f'span at {step.entry.start} keeps too few sliding-window rows to continue'
          f' inside it: hit ends at {step.entry.start}'
        )
        break
      usable.append(step)
    if not self.exact_anywhere:
      grid = sum(s.rows for s in usable) // self.chunk_size * self.chunk_size
      if grid < found:
        reasons.append(
          f'kernels not chunk-invariant: hit {found} rounded down to the chunk grid, {grid}'
        )
      usable = _cut(usable, grid)
    return usable, found, reasons

  def _fetch(self, steps, ids, reasons):
    """The spans of `steps`, checked and cut to their rows, up to the first that cannot be
    used (its reason recorded); and (start, rows, tier) of each."""
    out, used = [], []
    for step in steps:
      entry = step.entry
      block, tier = None, None
      for content in list(entry.blocks):
        try:
          block, tier = self.tiers.get(tiers_lib.name(entry.key, content))
          if block is None:
            reasons.append(f'span at {entry.start} ({content[:12]}…) is gone from every tier')
            self.index.remove(entry.key, content)
            continue
          spans.check(
            block, ids[entry.start : entry.start + step.rows], start=entry.start, target=self.target
          )
          break
        except (spans.StoreError, errors.SpanMismatchError) as e:
          reasons.append(f'span at {entry.start} ({content[:12]}…) not used: {e}')
          self.index.remove(entry.key, content)
          block = None
      if block is None:
        reasons.append(f'hit ends at {entry.start}')
        break
      out.append(spans.leading(block, step.rows, target=self.target))
      used.append((entry.start, step.rows, tier))
    return out, used

  def _deleted(self, name: str) -> None:
    """The store tier evicted span `name`: say so in the log, so no index offers it."""
    chain, content = name.split('/')
    self.index.remove(chain, content)
    self.log.append({'op': 'delete', 'domain': self.domain.digest, 'key': chain, 'block': content})


def _cut(steps: list[index_lib.Step], length: int) -> list[index_lib.Step]:
  """The steps covering the first `length` tokens."""
  out, pos = [], 0
  for step in steps:
    rows = min(step.rows, length - pos)
    if rows <= 0:
      break
    out.append(dataclasses.replace(step, rows=rows))
    pos += rows
  return out
