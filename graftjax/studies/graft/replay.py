"""The grafted arm in another process, which only reads the block store.

    python -m graftjax.studies.graft.replay REQUEST.json

The request names the model, the store, the schedule and, per sample, the
block key, the token ids and a folder holding the fresh arm's outputs
(`logits.npy`, `rollout_logits.npy`, `rollout_tokens.json`). This process
pins the deterministic configuration, loads the model itself, grafts each
block read from the store, continues, and writes the comparisons to the
request's `out` path as JSON.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

from graftjax import determinism


def replay(request: dict[str, Any]) -> dict[str, Any]:
  """Runs the grafted arm for every sample of `request`; returns the report."""
  import jax.numpy as jnp

  from graftjax import store as store_lib
  from graftjax.studies.common import corpus
  from graftjax.studies.graft import graft_gate
  from graftjax.models.gemma import model as gemma_model

  model = gemma_model.load_named(
    request['model'],
    dtype=jnp.dtype(request['dtype']),
    position_scheme=request.get('position_scheme', 'rope'),
  )
  if model.fingerprint != request['model_fingerprint']:
    raise RuntimeError(
      f"this process's model fingerprint {model.fingerprint} differs from the"
      f" depositor's {request['model_fingerprint']}"
    )
  store = store_lib.BlockStore(request['store'])
  schedule = graft_gate.Schedule(**request['schedule'])
  comparisons = []
  for item in request['samples']:
    sample = corpus.TextSample(
      source=item['source'],
      prefix_ids=tuple(item['prefix_ids']),
      continuation_ids=tuple(item['continuation_ids']),
    )
    out = graft_gate.grafted(model, sample, schedule, store, item['key'])
    comparisons.append(
      graft_gate.compare_arms(graft_gate.read_fresh(pathlib.Path(item['fresh_dir'])), out)
    )
  return {'determinism': determinism.record(), 'comparisons': comparisons}


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    print(__doc__, file=sys.stderr)
    return 2
  determinism.pin()
  request = json.loads(pathlib.Path(argv[1]).read_text())
  report = replay(request)
  pathlib.Path(request['out']).write_text(json.dumps(report))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
