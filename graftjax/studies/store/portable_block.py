"""A block deposited on one machine, grafted on another: are the logits that machine's own?

The library of experiments/portable_block.py. `deposit` prefills a prefix of seeded random
token ids, deposits it as a block in a `file` store packed into one tar file beside a
record (token ids, settings, this machine's fresh and grafted logit digests, the block's
file digest). `graft`, on another machine, unpacks the store, verifies the block against
the record, grafts it, processes the same continuation, and compares the grafted logits
with a fresh prefill computed there, and with the depositing machine's.
"""

from __future__ import annotations

import dataclasses
import pathlib
import tarfile
import tempfile
from typing import Any

import numpy as np

from graftjax import blocks
from graftjax import determinism
from graftjax import ledger
from graftjax import store as store_lib
from graftjax.studies.common import results

STORE_TAR = 'store.tar'
RECORD = 'deposit.json'


@dataclasses.dataclass(frozen=True)
class Settings:
  """The prefix, continuation and cache of one portability run."""

  prefix_tokens: int = 1024
  continuation_tokens: int = 32
  chunk_size: int = 64
  seed: int = 0

  @property
  def capacity(self) -> int:
    need = self.prefix_tokens + self.continuation_tokens
    return -(-need // self.chunk_size) * self.chunk_size


def token_ids(settings: Settings, vocab_size: int, bos: int = 2) -> list[int]:
  """BOS, then seeded random ids in [3, vocab): prefix and continuation."""
  rng = np.random.default_rng(settings.seed)
  n = settings.prefix_tokens + settings.continuation_tokens - 1
  return [bos, *(int(i) for i in rng.integers(3, vocab_size, n))]


def _continue(model, cache, ids: list[int], settings: Settings) -> np.ndarray:
  """float32 logits [continuation, V] of the continuation after the prefix in `cache`."""
  logits, _ = model.prefill(
    ids[settings.prefix_tokens :],
    cache=cache,
    chunk_size=settings.chunk_size,
    start_position=settings.prefix_tokens,
    logits='all',
  )
  return np.asarray(logits, np.float32)


def _fresh(model, ids: list[int], settings: Settings):
  """(the prefix's cache, the fresh continuation's logits)."""
  cache = model.init_cache(capacity=settings.capacity)
  _, cache = model.prefill(
    ids[: settings.prefix_tokens], cache=cache, chunk_size=settings.chunk_size, logits='none'
  )
  block = blocks.capture(
    cache,
    blocks.Span(0, settings.prefix_tokens),
    token_ids=ids[: settings.prefix_tokens],
    target=model.graft_target,
    chunk_size=settings.chunk_size,
  )
  return block, _continue(model, cache, ids, settings)


def _grafted(model, block: blocks.KVBlock, ids: list[int], settings: Settings) -> np.ndarray:
  """A block of layout 2 records no chunk size: its deposit's record (digest-verified by
  `graft`) names the one it was prefilled with, `settings.chunk_size`, used here too."""
  cache = blocks.graft(
    model.init_cache(capacity=settings.capacity),
    block,
    target=model.graft_target,
    chunk_size=settings.chunk_size,
    allow_other_shape=block.meta.chunk_size == 0,
  )
  return _continue(model, cache, ids, settings)


def deposit(model, *, model_name: str, settings: Settings, folder: pathlib.Path) -> dict:
  """Deposits the prefix's block into `folder/STORE_TAR` and writes `folder/RECORD`."""
  ids = token_ids(settings, model.config.vocab_size)
  block, fresh = _fresh(model, ids, settings)
  grafted = _grafted(model, block, ids, settings)
  folder.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as scratch:
    store = store_lib.BlockStore(pathlib.Path(scratch) / 'store')
    key = store.put(block)
    tree = store_lib.digest_tree(pathlib.Path(store.root) / key)
    with tarfile.open(folder / STORE_TAR, 'w') as tar:
      tar.add(pathlib.Path(store.root) / key, arcname=key)
  result = results.header(
    'portable_block',
    inputs={
      **results.model_inputs(model, model_name),
      'token_ids_sha256': ledger.sha256_array(np.asarray(ids, np.int32)),
    },
  )
  result.update(
    mode='deposit',
    model=model_name,
    model_fingerprint=model.fingerprint,
    settings=dataclasses.asdict(settings),
    token_ids=ids,
    key=key,
    block_tree_sha256=tree,
    fresh_logits_sha256=ledger.sha256_array(fresh),
    grafted_logits_sha256=ledger.sha256_array(grafted),
    summary={'grafted_equals_fresh_here': bool(fresh.tobytes() == grafted.tobytes())},
  )
  results.write(folder / RECORD, result, outputs=[folder / STORE_TAR])
  return result


def graft(model, *, model_name: str, folder: pathlib.Path) -> dict[str, Any]:
  """Grafts the block deposited in `folder` (verified) and compares; the result."""
  record = ledger.verify_result(folder / RECORD)
  (packed,) = record['outputs'].values()
  if ledger.sha256_file(folder / STORE_TAR) != packed:
    raise ValueError(f'{folder / STORE_TAR} is not the file its record {RECORD} names')
  if record['model_fingerprint'] != model.fingerprint:
    raise ValueError(
      f'the block was deposited with model {record["model_fingerprint"][:12]}…, this is'
      f' {model.fingerprint[:12]}…: load the same model ({record["model"]})'
    )
  settings = Settings(**record['settings'])
  ids = record['token_ids']
  with tempfile.TemporaryDirectory() as scratch:
    with tarfile.open(folder / STORE_TAR) as tar:
      tar.extractall(pathlib.Path(scratch) / 'store', filter='data')
    store = store_lib.BlockStore(pathlib.Path(scratch) / 'store', read_only=True)
    tree = store_lib.digest_tree(pathlib.Path(store.root) / record['key'])
    moved = store.get(record['key'])  # every byte verified
  _, fresh = _fresh(model, ids, settings)
  grafted = _grafted(model, moved, ids, settings)
  here = determinism.record()
  there = record['determinism']
  result = results.header(
    'portable_block',
    inputs={**results.model_inputs(model, model_name), 'deposit_record': record['result_sha256']},
  )
  result.update(
    mode='graft',
    model=model_name,
    deposited_on=there.get('device_kind'),
    grafted_on=here.get('device_kind'),
    key=record['key'],
    block_tree_sha256=tree,
    fresh_logits_sha256=ledger.sha256_array(fresh),
    grafted_logits_sha256=ledger.sha256_array(grafted),
    deposit_fresh_logits_sha256=record['fresh_logits_sha256'],
    summary={
      'block_files_equal': tree == record['block_tree_sha256'],
      'grafted_equals_fresh_here': bool(fresh.tobytes() == grafted.tobytes()),
      'fresh_equals_depositing_machines_fresh': ledger.sha256_array(fresh)
      == record['fresh_logits_sha256'],
      'grafted_equals_depositing_machines_grafted': ledger.sha256_array(grafted)
      == record['grafted_logits_sha256'],
    },
  )
  return result


def verdict(result: dict[str, Any]) -> str:
  """The result in one plain sentence."""
  s = result['summary']
  if result['mode'] == 'deposit':
    same = 'equal' if s['grafted_equals_fresh_here'] else 'NOT equal'
    return f'deposited {result["key"][:12]}… on {result["determinism"]["device_kind"]}: grafted {same} to fresh there'
  same = 'ARE' if s['grafted_equals_fresh_here'] else 'are NOT'
  return (
    f'a block deposited on {result["deposited_on"]} and grafted on {result["grafted_on"]}: the'
    f' grafted logits {same} byte-equal to the fresh ones computed there (block files'
    f' {"identical" if s["block_files_equal"] else "DIFFERENT"}; fresh logits'
    f' {"equal" if s["fresh_equals_depositing_machines_fresh"] else "not equal"} to the'
    " depositing machine's)"
  )
