r"""Does graftjax's float32 gemma-3-270m compute what HF and llama.cpp compute?

    python experiments/reference_agreement.py \
        --out=experiments/results/reference_agreement/reference_agreement.json

Reads the reference fixtures made by `scripts/reference/` (token ids of real
text from files on the build machine, with Hugging Face transformers' float32
logits and llama.cpp's logits for the same GGUF weights), runs every prompt
through our model and reports, per prompt and overall:
  * against HF: max |Δlogit| over HF's stored top-20 entries, max |Δ| of the
    full-vocabulary log-sum-exp, argmax agreement, and whether our 32-token
    greedy continuation equals HF's up to the first step whose HF top-1/top-2
    margin is under the tolerance (a near-tie may legitimately flip);
  * against llama.cpp (f32 KV cache, quantized matmuls): top-1 agreement over
    every position, and mean / p99 / max |Δlogit| over its stored top-20.
The bars: |Δ| <= 2e-3 against HF, top-1 agreement >= 93% against
llama.cpp. The result records the SHA-256 of both fixtures and its own digest
(`result_sha256`, see `graftjax.ledger`).

Prompts are processed in fixed chunks of `--chunk_size` tokens, the last one
padded (padding sits after the prompt, so causality keeps it out of the
prompt's logits, and it is dropped from the cache before decoding): every
prompt runs the same two shapes, [1, chunk] and [1, 1].
"""

from graftjax import determinism

determinism.pin()  # before jax starts

import json

from absl import app
from absl import flags

from graftjax.kernels import dots
from graftjax.studies.common import cli
from graftjax.studies.model import reference_agreement
from graftjax.studies.common import results

_PROMPTS = flags.DEFINE_list('prompts', None, 'Fixture prompt names (default: all).')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 128, 'Tokens per prefill forward call.')
_DOT_PRECISION = flags.DEFINE_enum(
  'dot_precision', 'highest', list(dots.NAMES), 'Of float32 products.'
)
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/reference_agreement/reference_agreement.json', 'Result JSON path.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = reference_agreement.experiment(
    prompt_names=_PROMPTS.value,
    chunk_size=_CHUNK_SIZE.value,
    dot_precision=_DOT_PRECISION.value,
  )
  print(json.dumps(result['overall'], indent=1))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
