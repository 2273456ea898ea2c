"""The restoring arm in a fresh process, on the same mesh as the depositor.

    python -m graftjax.studies.sharding.restore_child REQUEST.json

The request (`tensor_parallel.run_restore`) names the settings, the store and, per
sample, the block key, the token ids and the depositor's fresh continuation logits
(`.npy`). This process pins the deterministic configuration, draws the same weights
onto its own 1 x N mesh, restores each block from the `ShardedStore` into a fresh
cache, continues, and writes the comparisons (and the bytes this process read) to the
request's `out` path.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from graftjax import determinism


def restore_all(request: dict[str, Any]) -> dict[str, Any]:
  """Restores and continues every sample of `request`; returns the report."""
  import numpy as np

  from graftjax import exactness
  from graftjax.store import sharded as sharded_store
  from graftjax.studies.common import corpus
  from graftjax.studies.graft import graft_gate
  from graftjax.studies.sharding import tensor_parallel

  fields = dict(request['settings'])
  for name in ('chunk_sizes', 'prefixes'):
    fields[name] = tuple(fields[name])
  settings = tensor_parallel.Settings(**fields)
  model = tensor_parallel.load(settings)
  if model.fingerprint != request['model_fingerprint']:
    raise RuntimeError(
      f"this process's model fingerprint {model.fingerprint} differs from the"
      f" depositor's {request['model_fingerprint']}"
    )
  schedule = graft_gate.Schedule(**request['schedule'])
  store = sharded_store.ShardedStore(request['store'], read_only=True)
  out = []
  for s in request['samples']:
    sample = corpus.TextSample(
      source=s['source'],
      prefix_ids=tuple(s['prefix_ids']),
      continuation_ids=tuple(s['continuation_ids']),
    )
    before = (store.reads.chunks, store.reads.bytes)
    cache = tensor_parallel.restored(model, sample, schedule, store, s['key'])
    logits = graft_gate.continue_and_roll_out(model, cache, sample, schedule, rollout=False)
    fresh = np.load(s['fresh_logits'], allow_pickle=False)
    out.append(
      {
        'logits': exactness.compare(fresh, logits.logits).to_json(),
        'restore_chunks_read': store.reads.chunks - before[0],
        'restore_bytes_read': store.reads.bytes - before[1],
      }
    )
  return {'samples': out, 'determinism': determinism.record()}


def main(path: str) -> None:
  determinism.pin()
  with open(path) as f:
    request = json.load(f)
  report = restore_all(request)
  with open(request['out'], 'w') as f:
    json.dump(report, f)


if __name__ == '__main__':
  main(sys.argv[1])
