r"""A sweep of the matmul kernel's tiles at a model's projection shapes (--model).

    python experiments/bench_matmul_tiles.py --out=experiments/results/invariance_cost/bench_matmul_tiles_h200.json

Each candidate is block_m,block_n,block_k,num_warps,num_stages; per dtype, row
count (--rows: 1 for decode, a prefill chunk) and projection, it is timed in a
jitted loop beside XLA's dot, and its output compared byte for byte with the
default tiles' (which knobs change the numerics).
"""

from graftjax import determinism

determinism.pin()

import jax
from absl import app
from absl import flags
from graftjax.kernels import dots
from graftjax.studies.kernels import bench_matmul_tiles
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import results

_DTYPES = flags.DEFINE_multi_enum(
  'dtype', ['bfloat16', 'float32'], ['float32', 'bfloat16'], 'Dtypes.'
)
_ROWS = flags.DEFINE_multi_integer('rows', [1, 128], 'Rows M per call (repeat).')
_SHAPES = flags.DEFINE_multi_string('shape', None, 'Projections to time (default: all).')
_MODEL = model_flag.define_config('gemma3-270m', 'Config whose projection shapes to time.')
_CANDIDATES = flags.DEFINE_multi_string(
  'candidate',
  [
    '64,128,32,4,3',
    '128,64,32,4,3',
    '128,128,32,8,3',
    '64,64,64,4,3',
    '64,128,64,4,3',
    '128,128,64,8,3',
    '64,256,32,8,3',
    '16,64,32,4,3',
    '16,128,32,4,3',
    '16,256,32,4,3',
  ],
  'A candidate block_m,block_n,block_k,num_warps,num_stages (repeat).',
)
_DEFAULT = flags.DEFINE_string(
  'default', bench_matmul_tiles.DEFAULT, 'The tiles every candidate is compared with.'
)
_PRECISION = flags.DEFINE_enum(
  'precision', 'highest', list(dots.NAMES), 'Of every product (kernels/dots.py).'
)
_ITERS = flags.DEFINE_integer('iters', 50, 'Calls per timing loop.')
_TIME_BUDGET_S = flags.DEFINE_float('time_budget_s', 300.0, 'Skip candidates after this.')
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/invariance_cost/bench_matmul_tiles_cpu.json', 'Result JSON.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    result = bench_matmul_tiles.sweep(
      bench_matmul_tiles.Settings(
        dtypes=_DTYPES.value,
        rows=_ROWS.value,
        candidates=_CANDIDATES.value,
        shapes=_SHAPES.value,
        model=_MODEL.value,
        default=_DEFAULT.value,
        precision=_PRECISION.value,
        iters=_ITERS.value,
        time_budget_s=_TIME_BUDGET_S.value,
        interpret=jax.default_backend() != 'gpu',
      )
    )
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
