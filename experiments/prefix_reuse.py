r"""Automatic exact prefix reuse on few-shot GSM8K, a multi-turn conversation and a long shared
document: per request the hit, first-token time with and without reuse, bytes read, and the
SHA-256 of the logits with reuse against a cold prefill.

    python experiments/prefix_reuse.py --model=gemma3-270m \
        --out=experiments/results/prefix_reuse/prefix_reuse_cpu.json

Under --impl=xla hits are rounded down to the --chunk_size grid (the logits then equal a cold
prefill on that grid); under --impl=pallas they end at any token. The anchor rounds them down
to --anchor_grid tokens. The work is in graftjax/studies/prefix/prefix_reuse.py.
"""

from absl import app
from absl import flags
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import results
from graftjax.studies.prefix import prefix_reuse

_DEFAULTS = prefix_reuse.Settings()
_MODEL = model_flag.define(_DEFAULTS.model, random=True)
_IMPL = flags.DEFINE_enum('impl', _DEFAULTS.impl, ['xla', 'pallas'], 'Kernels for every op.')
_DTYPE = flags.DEFINE_enum('dtype', _DEFAULTS.dtype, ['float32', 'bfloat16'], 'Dtype.')
_SPAN = flags.DEFINE_integer('span', _DEFAULTS.span, 'Tokens per stored span.')
_CHUNK = flags.DEFINE_integer('chunk_size', _DEFAULTS.chunk_size, 'Prefill tokens per call.')
_CAPACITY = flags.DEFINE_integer('capacity', _DEFAULTS.capacity, 'Cache slots.')
_FEWSHOT = flags.DEFINE_integer('fewshot', _DEFAULTS.fewshot, 'GSM8K questions (8-shot).')
_TURNS = flags.DEFINE_integer('turns', _DEFAULTS.turns, 'Turns of the conversation.')
_DOC = flags.DEFINE_integer('document_tokens', _DEFAULTS.document_tokens, 'Document tokens.')
_QUESTIONS = flags.DEFINE_integer('questions', _DEFAULTS.questions, 'Document questions.')
_ANCHOR = flags.DEFINE_integer('anchor_grid', _DEFAULTS.anchor_grid, 'Anchor grid (tokens).')
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/prefix_reuse/prefix_reuse_cpu.json', 'Result JSON.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  settings = prefix_reuse.Settings(
    model=_MODEL.value,
    impl=_IMPL.value,
    dtype=_DTYPE.value,
    span=_SPAN.value,
    chunk_size=_CHUNK.value,
    capacity=_CAPACITY.value,
    fewshot=_FEWSHOT.value,
    turns=_TURNS.value,
    document_tokens=_DOC.value,
    questions=_QUESTIONS.value,
    anchor_grid=_ANCHOR.value,
  )
  results.write(_OUT.value, prefix_reuse.experiment(settings))


if __name__ == '__main__':
  cli.run(main)
