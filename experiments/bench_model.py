r"""Speed of the model: prefill and decode tokens/s, float32 and bfloat16.

    python experiments/bench_model.py --llamacpp_python=/path/to/python-with-llama-cpp \
        --out=experiments/results/cpu_speed/bench_model_cpu.json
    python experiments/bench_model.py --impl=xla --impl=pallas --prompt_tokens=4096 \
        --decode_tokens=128 --out=experiments/results/invariance_cost/bench_model_h200.json

With several --impl, each dtype runs under each kernel set side by side, and
`invariance_cost` gives how much slower the chunk-invariant Pallas kernels
make the model than XLA's (xla tokens/s over pallas tokens/s, minus 1).
`--per_op` adds, per dtype, the XLA model with one op at a time on its Pallas
kernel (`xla+attention=pallas`, ...), and `per_op_cost` the same ratio for
each: where the end-to-end cost of invariance comes from.

`--weights=random` times the --model architecture (gemma-3-270m by
default) with seeded random weights and token ids: the speed does not depend
on the values, and no GGUF is needed (e.g. on a machine the model is not
staged on).

Prefill: --prompt_tokens of standard-library text in chunks of --chunk_size
(timed after a warm-up run that compiles). Decode: --decode_tokens greedy
steps of the jitted while-loop. Beside them, llama.cpp on the same tokens
and machine (another interpreter, llama-cpp-python; its weights stay
Q4_K_M-quantized and its activations are quantized, ours are dequantized
float32/bfloat16, so this compares engines, not equal arithmetic).
"""

from graftjax import determinism

determinism.pin()

from absl import app
from absl import flags
from graftjax.kernels import dots
from graftjax.models.gemma import config as config_lib
from graftjax.studies.model import bench_model
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import results

_PROMPT_TOKENS = flags.DEFINE_integer('prompt_tokens', 512, 'Prefill length.')
_DECODE_TOKENS = flags.DEFINE_integer('decode_tokens', 32, 'Greedy decode steps.')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 128, 'Prefill chunk.')
_DTYPES = flags.DEFINE_multi_enum(
  'dtype', ['float32', 'bfloat16'], ['float32', 'bfloat16'], 'Dtypes.'
)
_IMPLS = flags.DEFINE_multi_enum('impl', ['xla'], list(config_lib.IMPLS), 'Kernel sets (repeat).')
_PER_OP = flags.DEFINE_bool('per_op', False, 'Also time XLA with each op alone on Pallas.')
_WEIGHTS = flags.DEFINE_enum(
  'weights',
  'real',
  ['real', 'random'],
  'The real GGUF weights, or seeded random ones of the same shapes.',
)
_MODEL = model_flag.define(
  'gemma3-270m',
  sorted(config_lib.NAMED_CONFIGS),
  'Architecture (--weights=real: gemma3-270m or a checkpoint folder).',
)
_REPEATS = flags.DEFINE_integer('repeats', 1, 'Timed runs per row; the fastest is kept.')
_LLAMACPP_PYTHON = flags.DEFINE_string(
  'llamacpp_python', None, 'Interpreter with llama-cpp-python.'
)
_DOT_PRECISION = flags.DEFINE_enum(
  'dot_precision', 'highest', list(dots.NAMES), 'Of float32 products (all sets).'
)
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/cpu_speed/bench_model_cpu.json', 'Result JSON.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    result = bench_model.experiment(
      bench_model.Settings(
        dtypes=_DTYPES.value,
        impls=_IMPLS.value,
        per_op=_PER_OP.value,
        weights=_WEIGHTS.value,
        model_name=_MODEL.value,
        prompt_tokens=_PROMPT_TOKENS.value,
        decode_tokens=_DECODE_TOKENS.value,
        chunk_size=_CHUNK_SIZE.value,
        repeats=_REPEATS.value,
        dot_precision=_DOT_PRECISION.value,
        llamacpp_python=_LLAMACPP_PYTHON.value,
      )
    )
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
