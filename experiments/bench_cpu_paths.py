r"""Which attention paths are practical on CPU: one prefill of the real model timed under each.

    python experiments/bench_cpu_paths.py --model=gemma3-270m --tokens=64,512 --capacity=2304 \
        --pallas_tokens=64 --out=experiments/results/paging/bench_cpu_paths_cpu.json

XLA under rope and rope_relative, the split-invariant 'xla_split' attention under rope_relative
(what composes pages exactly on CPU: docs/composition.md) and the Pallas kernels in the
interpreter (only up to --pallas_tokens). See graftjax/studies/paging/bench_cpu_paths.py.
"""

from graftjax import determinism

determinism.pin()

from absl import app
from absl import flags
from graftjax.studies.paging import bench_cpu_paths
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.paging import paging_scale
from graftjax.studies.common import results

_MODEL = model_flag.define('gemma3-270m', paging_scale.MODELS, 'Model.')
_TOKENS = flags.DEFINE_list('tokens', ['64', '512'], 'Prefill lengths (one chunk each).')
_CAPACITY = flags.DEFINE_integer('capacity', 2304, 'Cache slots (the top-4 needle context).')
_PALLAS_TOKENS = flags.DEFINE_integer('pallas_tokens', 64, 'Longest prefill in the interpreter.')
_OUT = flags.DEFINE_string('out', 'experiments/results/paging/bench_cpu_paths.json', 'Result JSON.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = bench_cpu_paths.experiment(
    model_name=_MODEL.value,
    tokens=[int(t) for t in _TOKENS.value],
    capacity=_CAPACITY.value,
    pallas_tokens=_PALLAS_TOKENS.value,
  )
  for row in result['rows']:
    print(
      f'{row["attention"]:9s} {row["position_scheme"]:13s} {row["tokens"]:5d} tokens:'
      f' {row["prefill_s"]:.2f} s ({row["tokens_per_s"]:.1f} tokens/s)'
    )
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
