r"""Grafted continuation vs single-pass prefill, across chunk sizes and batch sizes.

    python experiments/invariance.py --impl=pallas --samples=50 \
        --chunk_sizes=1,7,64,512 --batch_sizes=1,8 \
        --out=experiments/results/invariance_h200.json

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

import tempfile  # pylint: disable=g-import-not-at-top,wrong-import-position

from absl import app
from absl import flags
import jax.numpy as jnp
import numpy as np
import tqdm

from graftjax import ledger
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import ops
from graftjax.studies import cli
from graftjax.studies import corpus
from graftjax.studies import impl_flags
from graftjax.studies import invariance
from graftjax.studies import results

_MODEL = flags.DEFINE_enum('model', 'gemma3-270m', ['gemma3-270m', 'tiny'], 'Model.')
_IMPLS = impl_flags.define(default='pallas')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_SAMPLES = flags.DEFINE_integer('samples', 50, 'Text samples (over all shards).')
_PREFIX_TOKENS = flags.DEFINE_integer('prefix_tokens', 224, 'Grafted prefix tokens (BOS included).')
_CONTINUATION_TOKENS = flags.DEFINE_integer('continuation_tokens', 32, 'Tokens after the graft.')
_CHUNK_SIZES = flags.DEFINE_list('chunk_sizes', ['1', '7', '64', '512'], 'Chunk sizes.')
_BATCH_SIZES = flags.DEFINE_list('batch_sizes', ['1', '8'], 'Batch sizes of the grafted arm.')
_SHARD = flags.DEFINE_integer('shard', 0, 'Which contiguous range of the samples to run.')
_NUM_SHARDS = flags.DEFINE_integer('num_shards', 1, 'Number of ranges the samples are split into.')
_MERGE = flags.DEFINE_list('merge', [], 'Shard result files to combine into --out (runs nothing).')
_OUT = flags.DEFINE_string('out', 'experiments/results/invariance.json', 'Result JSON.')


def run(
  *,
  model_name: str,
  impl: str,
  per_op: dict[str, str],
  dtype: str,
  samples: int,
  prefix_tokens: int,
  continuation_tokens: int,
  chunk_sizes: tuple[int, ...],
  batch_sizes: tuple[int, ...],
  shard: int = 0,
  num_shards: int = 1,
  command: str,
) -> dict:
  """Loads the model with the given kernels, runs shard `shard` of `num_shards`; the result."""
  if not 0 <= shard < num_shards:
    raise ValueError(f'shard {shard} must be in [0, num_shards={num_shards})')
  model = gemma_model.load_named(model_name, dtype=jnp.dtype(dtype)).with_impl(impl, **per_op)
  tokenizer = model.tokenizer or corpus.ByteTokenizer(model.config.vocab_size)
  texts = corpus.text_samples(
    tokenizer,
    count=samples,
    prefix_tokens=prefix_tokens,
    continuation_tokens=continuation_tokens,
  )
  indices = invariance.shard_range(len(texts), shard, num_shards)
  need = prefix_tokens + continuation_tokens
  capacity = -(-need // ops.CAPACITY_MULTIPLE) * ops.CAPACITY_MULTIPLE
  with tempfile.TemporaryDirectory() as tmp:
    result = invariance.run_invariance(
      model=model,
      samples=[texts[i] for i in indices],
      chunk_sizes=tuple(chunk_sizes),
      batch_sizes=tuple(batch_sizes),
      capacity=capacity,
      store_root=tmp,
      progress=lambda it: tqdm.tqdm(it, desc='samples'),
    )
  for index, record in zip(indices, result['samples']):
    sample = texts[index]
    record.update(
      index=index,
      sha256_prefix_ids=ledger.sha256_tokens(sample.prefix_ids),
      sha256_continuation_ids=ledger.sha256_tokens(sample.continuation_ids),
    )
  return {
    **results.header(
      'invariance', inputs={'model_fingerprint': model.fingerprint}, command=command
    ),
    'model': model_name,
    'impl': impl,
    'impls': {op: per_op.get(op, impl) for op in config_lib.OPS},
    'dtype': dtype,
    'capacity': capacity,
    'settings': {
      'samples': samples,
      'prefix_tokens': prefix_tokens,
      'continuation_tokens': continuation_tokens,
      'chunk_sizes': list(chunk_sizes),
      'batch_sizes': list(batch_sizes),
    },
    'shard': {
      'index': shard,
      'count': num_shards,
      'samples': [indices.start, indices.stop],
    },
    **result,
  }


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
    result = run(
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
      command=command,
    )
  print(
    f'{result["model"]} impl={result["impl"]} {result["dtype"]}'
    f' on {result["determinism"]["device_kind"]}'
  )
  print('chunk  batch  samples byte-equal  KL max  argmax  max|Δ|')
  for cell in result['cells']:
    print(
      f'{cell["chunk_size"]:>5}  {cell["batch_size"]:>5}  {cell["samples_byte_equal"]:>3}/{cell["samples"]:<3}'
      f'              {cell["rows_kl_max"]:.3g}  {100 * cell["rows_argmax_agreement"]:.1f}%'
      f'  {cell["rows_max_abs_diff"]:.3g}'
    )
  if not result.get('complete', True):
    print(f'incomplete: {result["samples_run"]} of {result["settings"]["samples"]} planned samples')
  seconds = [s['seconds'] for s in result['samples']]
  print(f'{np.mean(seconds):.1f} s per sample')
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
