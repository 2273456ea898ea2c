"""One of two processes forming one mesh: deposit a block from the pair, restore it into the pair.

Started by test_sharded_processes.py, twice (process 0 and 1), each with 2 host devices:

    python tests/graftjax/sharded_pair.py <process_id> <port> <root> <out.json> [roundtrip|die]

`roundtrip`: prefill, capture (a compact block: the global layer whole, the sliding layers'
last W - 1 rows), `ShardedStore.put`, restore into a fresh sharded cache, continue; writes
what it saw to out.json. `data`: the same with the processes along the 'data' axis (a batch
of two rows, one a process, each row split over its two devices by kv heads), capturing the
row process 1 holds. `die`: deposits a compact block of random rows under the metadata the
roundtrip's block has, and process 1 kills itself (SIGKILL) after writing its first chunk of
the deposit.
"""

import json
import os
import signal
import sys

PROCESS_ID, PORT, ROOT, OUT = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
MODE = sys.argv[5] if len(sys.argv) > 5 else 'roundtrip'

from graftjax import determinism

# jax.distributed must start before anything touches the backend (determinism.pin does).
os.environ['XLA_FLAGS'] = ' '.join(
  ['--xla_force_host_platform_device_count=2', *determinism.pinned_xla_flags()]
)
import jax

jax.config.update('jax_cpu_collectives_implementation', 'gloo')
jax.distributed.initialize(
  f'127.0.0.1:{PORT}', num_processes=2, process_id=PROCESS_ID, initialization_timeout=120
)
determinism.pin()

import numpy as np
import tensorstore as ts

from graftjax import blocks
from graftjax.store import sharded as sharded_store
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import sharding

PREFIX, CONTINUATION, CHUNK, CAPACITY = 24, 16, 8, 64


def _bytes_read() -> int:
  metrics = ts.experimental_collect_matching_metrics('/tensorstore/kvstore/file/bytes_read')
  return sum(v['value'] for m in metrics for v in m['values'])


def _random_block(model, token_ids):
  """A compact block of random rows split as a capture from the model's cache would be."""
  config, n = model.config, len(token_ids)
  tail, r = blocks.kept_rows(model.graft_target, config.num_layers, n)
  rng = np.random.default_rng(1)

  def placed(layers, rows):
    shape = (layers, rows, config.num_kv_heads, config.head_dim)
    return sharding.put(rng.normal(size=shape).astype(np.float32), model.layout(1).block)

  k, k_tail = placed(config.num_layers - len(tail), n), placed(len(tail), r)
  meta = blocks.BlockMeta(
    model_fingerprint=model.fingerprint,
    token_ids=tuple(int(t) for t in token_ids),
    start=0,
    dtype='float32',
    position_scheme=model.position_scheme,
    capacity=CAPACITY,
    chunk_size=CHUNK,  # as `capture` records it: the key of the whole deposit
    tail_layers=tail,
    tail_rows=r,
  )
  return blocks.KVBlock(k=k, v=k, k_tail=k_tail, v_tail=k_tail, positions=np.arange(n), meta=meta)


def main():
  written = []
  write = sharded_store.write_chunk

  def recording_write(kv, name, data):
    write(kv, name, data)
    written.append(name.split('.sharded/', 1)[-1])
    if MODE == 'die' and PROCESS_ID == 1:
      os.kill(os.getpid(), signal.SIGKILL)

  sharded_store.write_chunk = recording_write

  data = 2 if MODE == 'data' else 1
  batch = data  # one row a data shard
  model = sharding.shard_model(
    gemma_model.tiny(num_heads=8, num_kv_heads=8),
    sharding.make_mesh(data, jax.device_count() // data),
  )
  ids = np.random.default_rng(0).integers(3, 256, PREFIX + CONTINUATION)
  if MODE == 'die':  # no model run needed: random rows under the block's own metadata
    block = _random_block(model, ids[:PREFIX])
    with open(OUT, 'w') as f:
      json.dump({'key': sharded_store.store_lib.key_for(block.meta)}, f)
    sharded_store.ShardedStore(ROOT).put(block)
    return
  cache = model.init_cache(batch_size=batch, capacity=CAPACITY)
  _, cache = model.prefill(ids[:PREFIX], cache=cache, chunk_size=CHUNK, logits='none')
  block = blocks.capture(
    cache,
    blocks.Span(0, PREFIX),
    token_ids=ids[:PREFIX],
    target=model.graft_target,
    chunk_size=CHUNK,
    batch_index=batch - 1,  # with data: the row process 1 holds
  )
  fresh, cache = model.prefill(
    ids[PREFIX:], cache=cache, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  result = {'process': PROCESS_ID, 'devices': jax.device_count(), 'key': None}
  with open(OUT, 'w') as f:  # the key, before the deposit starts
    json.dump({**result, 'key': sharded_store.store_lib.key_for(block.meta)}, f)

  key = sharded_store.ShardedStore(ROOT).put(block)
  store = sharded_store.ShardedStore(ROOT)  # fresh counters
  before = _bytes_read()
  restored = store.restore(
    key,
    model.init_cache(batch_size=batch, capacity=CAPACITY),
    target=model.graft_target,
    chunk_size=CHUNK,
  )
  ts_bytes = _bytes_read() - before
  # The rows the block holds: its whole layers' every slot, its tail layers' last r.
  kept = [
    (list(block.whole_layers), 0),
    (list(block.meta.tail_layers), PREFIX - block.meta.tail_rows),
  ]
  cache_equal = all(
    np.asarray(a.data)[layers, :, first:PREFIX].tobytes()
    == np.asarray(b.data)[layers, :, first:PREFIX].tobytes()
    for name in ('k', 'v')
    for layers, first in kept
    for a, b in zip(
      getattr(restored, name).addressable_shards,
      getattr(cache, name).addressable_shards,
      strict=True,
    )
  )
  heads_held = sorted({s.index[3].indices(8)[:2] for s in restored.k.addressable_shards})
  rows_held = sorted({s.index[1].indices(batch)[:2] for s in restored.k.addressable_shards})
  grafted, _ = model.prefill(
    ids[PREFIX:], cache=restored, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  manifest = os.path.join(ROOT, key, 'manifest.json')
  result.update(
    key=key,
    listed=store.list(),
    written=written,
    reads_chunks=store.reads.chunks,
    reads_bytes=store.reads.bytes,
    tensorstore_bytes_read=ts_bytes,
    manifest_bytes=os.path.getsize(manifest),
    block_kv_bytes=sum(
      a.size * a.dtype.itemsize for a in (block.k, block.v, block.k_tail, block.v_tail)
    ),
    tail_rows=block.meta.tail_rows,
    positions_bytes=PREFIX * 4,
    heads_held=heads_held,
    rows_held=rows_held,
    cache_equal=cache_equal,
    grafted_equals_fresh=all(
      np.asarray(a.data).tobytes() == np.asarray(b.data).tobytes()
      for a, b in zip(grafted.addressable_shards, fresh.addressable_shards, strict=True)
    ),
  )
  with open(OUT, 'w') as f:
    json.dump(result, f)


if __name__ == '__main__':
  main()
