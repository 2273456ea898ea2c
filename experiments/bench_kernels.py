r"""Speed of the invariant Pallas kernels against their plain XLA counterparts.

    python experiments/bench_kernels.py               # GPU: the real sizes
    python experiments/bench_kernels.py --quick       # CPU smoke test

Cases, at gemma-3-270m shapes (N=4 query heads, K=1 kv head, H=256, D=640,
MLP 640 -> 2048), each in float32 and bfloat16, each as Pallas kernel and as
XLA (the `*_reference` beside the kernel, jitted):
  attention prefill  T = S in --lengths (queries over a cache they fill),
                     plus a sliding-window (--window) variant in bfloat16
  attention decode   T = 1 over S in --lengths cached slots
  rotary, rms_norm, matmul  on --aux_lengths tokens
Timing: --warmup calls, then the median of --repeats calls, each ended by
block_until_ready (`median_s`, host clock: dispatch included); calls under
5 ms are timed again as --loop_iters calls inside one jitted loop
(`device_s`, `graftjax.studies.common.timing.time_in_loop`), next to the same loop around
no call (`loop_overhead_s`); the fractions below use `kernel_s` = `device_s`
- `loop_overhead_s` (= `median_s` for longer calls). FLOPs and bytes are
counted from the shapes (useful work, minimal HBM traffic: causal pairs only,
every input and output touched once),
and reported as fractions of the H200's HBM bandwidth (4.3e12 B/s) and
bfloat16 dense peak (7.9e14 FLOP/s) whatever the dtype. Each case also
records the largest |pallas - xla| difference. A case that fails (e.g. a
lowering error) is recorded with its error and the run goes on; cases past
--time_budget_s are recorded as skipped.

Writes experiments/results/invariance_cost/bench_kernels_<backend>.json with the pinned
configuration (graftjax.determinism), jax version and device kind.
"""

from graftjax import determinism

determinism.pin()  # before jax starts

import pathlib

from absl import app
from absl import flags
import jax

from graftjax.studies.kernels import bench_kernels
from graftjax.studies.common import cli
from graftjax.studies.common import results

_QUICK = flags.DEFINE_bool('quick', False, 'Tiny sizes, interpret mode off GPU: a smoke test.')
_LENGTHS = flags.DEFINE_list(
  'lengths',
  ['1024', '4096', '16384', '32768'],
  'Attention sizes: prefill T = S, and decode cache sizes S.',
)
_AUX_LENGTHS = flags.DEFINE_list(
  'aux_lengths', ['1', '4096', '32768'], 'Token counts for rotary, rms_norm and matmul.'
)
_DTYPES = flags.DEFINE_multi_enum(
  'dtype', ['float32', 'bfloat16'], ['float32', 'bfloat16'], 'Dtypes (repeat).'
)
_KERNELS = flags.DEFINE_list('kernels', list(bench_kernels.KERNELS), 'Kernels to run.')
_WINDOW = flags.DEFINE_integer(
  'window', 512, 'Sliding window of the windowed prefill case (0: none).'
)
_XLA_MAX_LENGTH = flags.DEFINE_integer(
  'xla_max_length', 16384, 'Skip XLA attention prefill above this T (its [T, S] scores in float32).'
)
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed calls per case.')
_REPEATS = flags.DEFINE_integer('repeats', 10, 'Timed calls per case.')
_LOOP_ITERS = flags.DEFINE_integer(
  'loop_iters',
  100,
  'Calls per jitted loop for the device-clock time of cases under 5 ms (0: host clock only).',
)
_TIME_BUDGET_S = flags.DEFINE_float(
  'time_budget_s', 170.0, 'Skip the remaining cases after this long.'
)
_NORM_DIM = flags.DEFINE_integer('norm_dim', bench_kernels.HIDDEN, 'rms_norm features.')
_NORM_WARPS = flags.DEFINE_list('norm_warps', ['4'], 'rms_norm warp counts (4: the default).')
_OUT = flags.DEFINE_string(
  'out',
  None,
  'Result JSON (default experiments/results/invariance_cost/bench_kernels_<backend>.json).',
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = bench_kernels.run_benchmarks(
    bench_kernels.Settings(
      kernels=_KERNELS.value,
      lengths=[int(n) for n in _LENGTHS.value],
      aux_lengths=[int(n) for n in _AUX_LENGTHS.value],
      dtypes=_DTYPES.value,
      window=_WINDOW.value,
      xla_max_length=_XLA_MAX_LENGTH.value,
      warmup=_WARMUP.value,
      repeats=_REPEATS.value,
      loop_iters=_LOOP_ITERS.value,
      time_budget_s=_TIME_BUDGET_S.value,
      norm_dim=_NORM_DIM.value,
      norm_warps=[int(n) for n in _NORM_WARPS.value],
      quick=_QUICK.value,
    )
  )
  out = pathlib.Path(
    _OUT.value or f'experiments/results/invariance_cost/bench_kernels_{jax.default_backend()}.json'
  )
  failed = [c for c in result['cases'] if 'error' in c]
  print(f'{len(result["cases"])} cases, {len(failed)} failed, {result["wall_s"]:.1f} s')
  results.write(out, result)


if __name__ == '__main__':
  cli.run(main)
