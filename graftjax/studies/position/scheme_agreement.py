"""How far each position scheme's computation is from `rope` on the same weights.

The library of experiments/scheme_agreement.py: `experiment(...)` compares every scheme's
logits with `rope`'s on real text, one prefill per sample.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from graftjax import exactness
from graftjax import ledger
from graftjax.models.gemma import model as gemma_model
from graftjax.studies.common import corpus
from graftjax.studies.common import results


def all_logits(model, ids) -> np.ndarray:
  logits, _ = model.prefill(
    ids, cache=model.init_cache(capacity=len(ids)), chunk_size=len(ids), logits='all'
  )
  return np.asarray(logits[0])


def experiment(
  *,
  model_name: str = 'gemma3-270m',
  schemes: list[str],
  samples: int,
  tokens: int,
  dtype: str,
  command: str | None = None,
  log: Callable[[str], None] = print,
) -> dict:
  """Each scheme's logits against rope's on the same weights and text (`model_name`, a name
  `model.load_named` takes or a checkpoint folder); the result."""
  base = gemma_model.load_named(model_name, dtype=jnp.dtype(dtype))
  chosen = corpus.text_samples(
    base.tokenizer, count=samples, prefix_tokens=tokens - 1, continuation_tokens=1
  )
  texts = [list(s.prefix_ids) + list(s.continuation_ids) for s in chosen]
  reference = [all_logits(base, ids) for ids in texts]
  rows = {}
  for scheme in schemes:
    model = base.with_position_scheme(scheme)
    found = [exactness.compare(ref, all_logits(model, ids)) for ref, ids in zip(reference, texts)]
    rows[scheme] = {**exactness.summarize(found), 'per_sample': [c.to_json() for c in found]}
    log(f'{scheme} { ({k: v for k, v in rows[scheme].items() if k != "per_sample"}) }')
  inputs = {
    **results.model_inputs(base, model_name),
    'model_fingerprint_rope': base.fingerprint,
    'samples': [
      {'source': s.source, 'sha256_ids': ledger.sha256_tokens(ids)} for s, ids in zip(chosen, texts)
    ],
  }
  return {
    **results.header('scheme_agreement', inputs=inputs, command=command),
    'dtype': dtype,
    'vs_rope': rows,
  }
