r"""How far each position scheme's computation is from the trained `rope` on the same weights.

    python experiments/scheme_agreement.py --scheme=rope_f64 --scheme=rope_relative \
        --samples=3 --out=experiments/results/relocation/scheme_agreement_cpu.json

`rope_f64` and `rope_relative` compute the same function as `rope` in exact
arithmetic; this measures their float differences on real text (logits of
every token of --tokens tokens of a standard-library file, one prefill).
"""

from graftjax import determinism

determinism.pin()

from absl import app
from absl import flags
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import results
from graftjax.studies.position import scheme_agreement

_MODEL = model_flag.define('gemma3-270m', help_text='Weights every scheme runs.')
_SCHEMES = flags.DEFINE_multi_enum(
  'scheme',
  ['rope_f64', 'rope_relative'],
  ['rope_f64', 'rope_relative'],
  'Schemes compared with rope.',
)
_SAMPLES = flags.DEFINE_integer('samples', 3, 'Text samples.')
_TOKENS = flags.DEFINE_integer('tokens', 160, 'Tokens per sample (BOS included).')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/relocation/scheme_agreement.json', 'Result JSON.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = scheme_agreement.experiment(
    model_name=_MODEL.value,
    schemes=_SCHEMES.value,
    samples=_SAMPLES.value,
    tokens=_TOKENS.value,
    dtype=_DTYPE.value,
  )
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
