r"""Grafted continuation vs single-pass prefill, across chunk sizes and batch sizes.

    python experiments/invariance.py --impl=pallas --samples=50 \
        --chunk_sizes=1,7,64,512 --batch_sizes=1,8 \
        --out=experiments/results/invariance/invariance_h200.json

With `--impl=pallas` (chunk-invariant kernels) every cell should be byte
equal to the single pass; with `--impl=xla` the same comparison shows how
XLA's shape-dependent kernels break it. `--attention_impl`, `--matmul_impl`,
`--norm_impl` and `--rotary_impl` set one op apart from `--impl`.

A long run can be split: `--shard=i --num_shards=n` runs the i-th of n
contiguous ranges of the `--samples` samples, and
`--merge=shard0.json,shard1.json,...` checks the shards' digests and
settings and writes the combined table to `--out`; shards covering only the
first samples (a run cut short) merge with `complete: false`.
"""

from graftjax import determinism

determinism.pin()

from absl import app
from absl import flags

from graftjax import ledger
from graftjax.kernels import dots
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import impl_flags
from graftjax.studies.kernels import invariance
from graftjax.studies.common import results

_MODEL = model_flag.define('gemma3-270m', random=True)
_IMPLS = impl_flags.define(default='pallas')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_DOT_PRECISION = flags.DEFINE_enum(
  'dot_precision', 'highest', list(dots.NAMES), 'Of float32 products.'
)
_SAMPLES = flags.DEFINE_integer('samples', 50, 'Text samples (over all shards).')
_PREFIX_TOKENS = flags.DEFINE_integer('prefix_tokens', 224, 'Grafted prefix tokens (BOS included).')
_CONTINUATION_TOKENS = flags.DEFINE_integer('continuation_tokens', 32, 'Tokens after the graft.')
_CHUNK_SIZES = flags.DEFINE_list('chunk_sizes', ['1', '7', '64', '512'], 'Chunk sizes.')
_BATCH_SIZES = flags.DEFINE_list('batch_sizes', ['1', '8'], 'Batch sizes of the grafted arm.')
_SHARD = flags.DEFINE_integer('shard', 0, 'Which contiguous range of the samples to run.')
_NUM_SHARDS = flags.DEFINE_integer('num_shards', 1, 'Number of ranges the samples are split into.')
_MERGE = flags.DEFINE_list('merge', [], 'Shard result files to combine into --out (runs nothing).')
_OUT = flags.DEFINE_string('out', 'experiments/results/invariance/invariance.json', 'Result JSON.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  command = results.command_line()
  if _MERGE.value:
    result = invariance.merge_shards([ledger.verify_result(p) for p in _MERGE.value], command)
  elif not 0 <= _SHARD.value < _NUM_SHARDS.value:
    raise app.UsageError(f'--shard={_SHARD.value} must be in [0, --num_shards={_NUM_SHARDS.value})')
  else:
    impl, per_op = _IMPLS.value
    result = invariance.experiment(
      invariance.Settings(
        model_name=_MODEL.value,
        impl=impl,
        per_op=per_op,
        dtype=_DTYPE.value,
        samples=_SAMPLES.value,
        prefix_tokens=_PREFIX_TOKENS.value,
        continuation_tokens=_CONTINUATION_TOKENS.value,
        chunk_sizes=tuple(int(c) for c in _CHUNK_SIZES.value),
        batch_sizes=tuple(int(b) for b in _BATCH_SIZES.value),
        shard=_SHARD.value,
        num_shards=_NUM_SHARDS.value,
        dot_precision=_DOT_PRECISION.value,
      ),
      command=command,
    )
  print(invariance.format_table(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
