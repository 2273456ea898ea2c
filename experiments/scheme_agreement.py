r"""How far each position scheme's computation is from the trained `rope` on the same weights.

    python experiments/scheme_agreement.py --scheme=rope_f64 --scheme=rope_relative \
        --samples=3 --out=experiments/results/scheme_agreement_cpu.json

`rope_f64` and `rope_relative` compute the same function as `rope` in exact
arithmetic; this measures their float differences on real text (logits of
every token of --tokens tokens of a standard-library file, one prefill).
"""

from graftjax import determinism

determinism.pin()

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
import jax.numpy as jnp
import numpy as np

from graftjax import exactness
from graftjax import ledger
from graftjax.models.gemma import model as gemma_model
from graftjax.studies import cli
from graftjax.studies import corpus
from graftjax.studies import results

_SCHEMES = flags.DEFINE_multi_enum(
  'scheme',
  ['rope_f64', 'rope_relative'],
  ['rope_f64', 'rope_relative'],
  'Schemes compared with rope.',
)
_SAMPLES = flags.DEFINE_integer('samples', 3, 'Text samples.')
_TOKENS = flags.DEFINE_integer('tokens', 160, 'Tokens per sample (BOS included).')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_OUT = flags.DEFINE_string('out', 'experiments/results/scheme_agreement.json', 'Result JSON.')


def all_logits(model, ids) -> np.ndarray:
  logits, _ = model.prefill(
    ids, cache=model.init_cache(capacity=len(ids)), chunk_size=len(ids), logits='all'
  )
  return np.asarray(logits[0])


def run(
  *, schemes: list[str], samples: int, tokens: int, dtype: str, command: str | None = None
) -> dict:
  """Each scheme's logits against rope's on the same weights and text; the result."""
  base = gemma_model.load('gemma3-270m', dtype=jnp.dtype(dtype))
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
    print(scheme, {k: v for k, v in rows[scheme].items() if k != 'per_sample'})
  inputs = {
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = run(
    schemes=_SCHEMES.value, samples=_SAMPLES.value, tokens=_TOKENS.value, dtype=_DTYPE.value
  )
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
