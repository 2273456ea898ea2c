r"""Which attention tile sizes to fix: a sweep of `BlockSizes` and launch knobs.

    python experiments/bench_attention_tiles.py            # GPU
    python experiments/bench_attention_tiles.py --quick    # CPU smoke test

The tile sizes decide the bits (see graftjax.kernels.attention), so each
dtype gets one fixed default; this script measures the candidates, on the
device clock (`graftjax.studies.common.timing.time_in_loop`), at gemma-3-270m shapes
(N=4, K=1, H=256): decode (T = 1) over S in --decode_lengths cached slots and
prefill T = S in --prefill_lengths, against the bandwidth floor (K and V read
once: 2 S H itemsize bytes over 4.3e12 B/s) and the XLA reference. Every
candidate is also checked against the reference (max |difference|).

A candidate is "block_q,block_k,block_s,num_warps" or, with the pipelining
stages of the two kernels (speed knobs: the rows' output digests show whether
they change bits), "...,num_stages,combine_stages", then optionally
"...,combine_group,combine_block_h" (the combine's sum; --float32 / --bfloat16
lists). Writes experiments/results/invariance_cost/bench_attention_tiles_<backend>.json.
"""

from graftjax import determinism

determinism.pin()  # before jax starts

import pathlib

from absl import app
from absl import flags
import jax

from graftjax.kernels import dots
from graftjax.studies.kernels import bench_attention_tiles
from graftjax.studies.common import cli
from graftjax.studies.common import results

_QUICK = flags.DEFINE_bool('quick', False, 'Tiny sizes, interpret mode off GPU.')
_FLOAT32 = flags.DEFINE_multi_string(
  'float32',
  [
    '4,32,256,4',
    '4,32,256,8',
    '4,16,256,8',
    '4,32,128,4',
    '4,32,128,8',
    '4,16,128,8',
    '4,32,512,8',
  ],
  'A float32 candidate q,k,s,warps[,stages,combine_stages[,combine_group,combine_block_h]] (repeat).',
)
_BFLOAT16 = flags.DEFINE_multi_string(
  'bfloat16',
  [
    '4,64,512,4',
    '4,64,512,8',
    '4,64,256,4',
    '4,64,256,8',
    '4,64,1024,8',
    '4,32,256,4',
    '4,32,128,4',
  ],
  'A bfloat16 candidate q,k,s,warps[,stages,combine_stages[,combine_group,combine_block_h]] (repeat).',
)
_DECODE_LENGTHS = flags.DEFINE_list('decode_lengths', ['1024', '32768'], 'Decode S.')
_PREFILL_LENGTHS = flags.DEFINE_list('prefill_lengths', ['4096'], 'Prefill T = S.')
_ITERS = flags.DEFINE_integer('iters', 50, 'Calls per timed loop (decode).')
_TIME_BUDGET_S = flags.DEFINE_float('time_budget_s', 300.0, 'Skip the rest after this long.')
_TRACE_KERNELS = flags.DEFINE_integer(
  'trace_kernels', 0, 'Also trace one call per candidate and keep its N largest kernels.'
)
_PRECISION = flags.DEFINE_enum(
  'precision', 'highest', list(dots.NAMES), 'Of every dot (kernels/dots.py).'
)
_OUT = flags.DEFINE_string('out', None, 'Result JSON (default by backend).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    result = bench_attention_tiles.sweep(
      bench_attention_tiles.Settings(
        candidates={'float32': _FLOAT32.value, 'bfloat16': _BFLOAT16.value},
        decode_lengths=[int(n) for n in _DECODE_LENGTHS.value],
        prefill_lengths=[int(n) for n in _PREFILL_LENGTHS.value],
        iters=_ITERS.value,
        time_budget_s=_TIME_BUDGET_S.value,
        interpret=jax.default_backend() != 'gpu',
        quick=_QUICK.value,
        trace_kernels=_TRACE_KERNELS.value,
        precision=_PRECISION.value,
      )
    )
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  out = pathlib.Path(
    _OUT.value
    or f'experiments/results/invariance_cost/bench_attention_tiles_{jax.default_backend()}.json'
  )
  failed = [r for r in result['rows'] if 'error' in r]
  print(f'{len(result["rows"])} rows, {len(failed)} failed, {result["wall_s"]:.1f} s')
  results.write(out, result)


if __name__ == '__main__':
  cli.run(main)
