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

import shlex  # pylint: disable=g-import-not-at-top,wrong-import-position
import sys
import tempfile

from absl import app
from absl import flags
import jax.numpy as jnp
import numpy as np
import tqdm

from graftjax.studies import corpus
from graftjax.studies import impl_flags
from graftjax.studies import invariance
from graftjax import ledger
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import ops

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


def run(command: str) -> dict:
  model = _IMPLS.apply(gemma_model.load_named(_MODEL.value, dtype=jnp.dtype(_DTYPE.value)))
  tokenizer = model.tokenizer or corpus.ByteTokenizer(model.config.vocab_size)
  samples = corpus.text_samples(
    tokenizer,
    count=_SAMPLES.value,
    prefix_tokens=_PREFIX_TOKENS.value,
    continuation_tokens=_CONTINUATION_TOKENS.value,
  )
  if not 0 <= _SHARD.value < _NUM_SHARDS.value:
    raise app.UsageError(f'--shard={_SHARD.value} must be in [0, --num_shards={_NUM_SHARDS.value})')
  indices = invariance.shard_range(len(samples), _SHARD.value, _NUM_SHARDS.value)
  need = _PREFIX_TOKENS.value + _CONTINUATION_TOKENS.value
  capacity = -(-need // ops.CAPACITY_MULTIPLE) * ops.CAPACITY_MULTIPLE
  with tempfile.TemporaryDirectory() as tmp:
    result = invariance.run_invariance(
      model=model,
      samples=[samples[i] for i in indices],
      chunk_sizes=tuple(int(c) for c in _CHUNK_SIZES.value),
      batch_sizes=tuple(int(b) for b in _BATCH_SIZES.value),
      capacity=capacity,
      store_root=tmp,
      progress=lambda it: tqdm.tqdm(it, desc='samples'),
    )
  for index, record in zip(indices, result['samples']):
    sample = samples[index]
    record.update(
      index=index,
      sha256_prefix_ids=ledger.sha256_tokens(sample.prefix_ids),
      sha256_continuation_ids=ledger.sha256_tokens(sample.continuation_ids),
    )
  return {
    'experiment': 'invariance',
    'command': command,
    'model': _MODEL.value,
    'impl': _IMPLS.impl.value,
    'impls': _IMPLS.as_json(),
    'dtype': _DTYPE.value,
    'capacity': capacity,
    'settings': {
      'samples': _SAMPLES.value,
      'prefix_tokens': _PREFIX_TOKENS.value,
      'continuation_tokens': _CONTINUATION_TOKENS.value,
      'chunk_sizes': [int(c) for c in _CHUNK_SIZES.value],
      'batch_sizes': [int(b) for b in _BATCH_SIZES.value],
    },
    'shard': {
      'index': _SHARD.value,
      'count': _NUM_SHARDS.value,
      'samples': [indices.start, indices.stop],
    },
    'determinism': determinism.record(),
    'inputs': {'model_fingerprint': model.fingerprint},
    **result,
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  command = shlex.join(['python'] + sys.argv)
  if _MERGE.value:
    result = invariance.merge_shards([ledger.verify_result(p) for p in _MERGE.value], command)
  else:
    result = run(command)
  digest = ledger.write_result(_OUT.value, result)
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
  print(f'wrote {_OUT.value} (sha256 {digest})')


if __name__ == '__main__':
  app.run(main)
