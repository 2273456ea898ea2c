r"""Where prefill and decode spend their time: device kernels summed by name.

    python experiments/profile_model.py --dtype=bfloat16 --impl=xla --impl=pallas \
        --out=experiments/results/profile/profile_model_h200_bfloat16.json

Traces one prefill (--prompt_tokens in chunks of --chunk_size) and one decode
(--decode_tokens greedy steps) of the --model architecture with seeded random
weights, per kernel set, and sums the device's kernels by name from the jax
trace: calls, total and mean microseconds, and the device's busy time against
the phase's wall time. On a CPU backend the same runs, with host events.
"""

from graftjax import determinism

determinism.pin()

from absl import app
from absl import flags
from graftjax.models.gemma import config as config_lib
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.model import profile_model
from graftjax.studies.common import results

_PROMPT_TOKENS = flags.DEFINE_integer('prompt_tokens', 1024, 'Prefill length.')
_DECODE_TOKENS = flags.DEFINE_integer('decode_tokens', 64, 'Greedy decode steps.')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 128, 'Prefill chunk.')
_DTYPE = flags.DEFINE_enum('dtype', 'bfloat16', ['float32', 'bfloat16'], 'Compute dtype.')
_IMPLS = flags.DEFINE_multi_enum('impl', ['xla'], list(config_lib.IMPLS), 'Kernel sets (repeat).')
_MODEL = model_flag.define_config('gemma3-270m', 'Architecture (seeded random weights).')
_TOP = flags.DEFINE_integer('top', 30, 'Kernels kept per phase, largest total first.')
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/profile/profile_model_cpu.json', 'Result JSON.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = profile_model.experiment(
    dtype=_DTYPE.value,
    impls=_IMPLS.value,
    model_name=_MODEL.value,
    prompt_tokens=_PROMPT_TOKENS.value,
    decode_tokens=_DECODE_TOKENS.value,
    chunk_size=_CHUNK_SIZE.value,
    top=_TOP.value,
  )
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
