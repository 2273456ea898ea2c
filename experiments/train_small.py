r"""Trains a small byte-level Gemma 3 under one position scheme; saves it with orbax.

    python experiments/train_small.py --scheme=alibi --model=small --steps=2000 \
        --out=experiments/checkpoints/small_alibi

Data: UTF-8 bytes of the Python standard library's .py files, split into
train and held-out sets by file. The checkpoint folder gets `params/`
(orbax) and `model.json` (config, settings, corpus digests, held-out loss,
params SHA-256, the pinned configuration); `experiments/relocation.py
--model=<that folder>` sweeps it.
"""

from graftjax import determinism

determinism.pin()  # before jax starts

from absl import app
from absl import flags

from graftjax.models.gemma import schemes
from graftjax.studies.common import cli
from graftjax.studies.position import training

_SCHEME = flags.DEFINE_enum(
  'scheme',
  'rope',
  list(schemes.names()),
  'Position scheme the model is trained with (a registered name).',
)
_MODEL = flags.DEFINE_enum('model', 'small', sorted(training.SIZES), 'Named model size.')
_STEPS = flags.DEFINE_integer('steps', 2000, 'Optimiser steps.')
_BATCH = flags.DEFINE_integer('batch', 64, 'Windows per step.')
_SEQ_LEN = flags.DEFINE_integer('seq_len', 256, 'Bytes per window (the cache capacity).')
_LEARNING_RATE = flags.DEFINE_float('learning_rate', 3e-3, 'Peak learning rate.')
_WARMUP_STEPS = flags.DEFINE_integer('warmup_steps', 100, 'Linear warmup steps.')
_EVAL_EVERY = flags.DEFINE_integer('eval_every', 250, 'Steps between held-out evaluations.')
_EVAL_BATCHES = flags.DEFINE_integer('eval_batches', 4, 'Held-out batches per evaluation.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the initial params and the batch order.')
_HELD_OUT_EVERY = flags.DEFINE_integer('held_out_every', 20, 'Hold out one file in this many.')
_MAX_FILES = flags.DEFINE_integer('max_files', None, 'Use only the first files (smoke runs).')
_OUT = flags.DEFINE_string('out', None, 'Checkpoint folder to create.', required=True)
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'Replace an existing checkpoint folder.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  settings = training.Settings(
    steps=_STEPS.value,
    batch=_BATCH.value,
    seq_len=_SEQ_LEN.value,
    learning_rate=_LEARNING_RATE.value,
    warmup_steps=_WARMUP_STEPS.value,
    seed=_SEED.value,
    eval_every=_EVAL_EVERY.value,
    eval_batches=_EVAL_BATCHES.value,
  )
  record = training.train_and_save(
    scheme=_SCHEME.value,
    size=_MODEL.value,
    settings=settings,
    held_out_every=_HELD_OUT_EVERY.value,
    max_files=_MAX_FILES.value,
    out_dir=_OUT.value,
    overwrite=_OVERWRITE.value,
  )
  print(
    f'{record["config"]["position_scheme"]} {record["size"]}: '
    f'{record["parameter_count"]:,} params, held-out loss {record["held_out_loss"]:.4f}'
    f' nats/byte ({record["held_out_bits_per_byte"]:.3f} bits/byte)'
    f' over {record["held_out_tokens"]:,} bytes'
  )
  print(f'wrote {_OUT.value} (model.json sha256 {record["result_sha256"]})')


if __name__ == '__main__':
  cli.run(main)
