r"""A block deposited on one machine, grafted on another: equal to that machine's fresh logits?

    python experiments/portable_block.py --mode=deposit --dir=/tmp/portable_h100
    python experiments/portable_block.py --mode=graft --dir=/tmp/portable_h100 \
        --out=experiments/results/store_sync/portable_block_h100_to_h200.json

`deposit` prefills --prefix_tokens seeded random token ids, deposits the block in a `file`
store packed into DIR/store.tar, and writes DIR/deposit.json (the ids, this machine's fresh
and grafted logit digests, the block files' digest). `graft`, given such a DIR from another
machine, verifies the record, the tar and every byte of the block, grafts it, processes the
same continuation, and records whether the grafted logits equal a fresh prefill there and
the depositing machine's. experiments/device/portable_block.sh runs both on GPUs.
"""

from graftjax import determinism

determinism.pin()  # before jax starts

import pathlib

import jax.numpy as jnp
from absl import app
from absl import flags

from graftjax.models.gemma import model as gemma_model
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import impl_flags
from graftjax.studies.store import portable_block
from graftjax.studies.common import results

_MODE = flags.DEFINE_enum('mode', None, ['deposit', 'graft'], 'Deposit here, or graft here.')
_DIR = flags.DEFINE_string('dir', None, 'The deposit folder (store.tar, deposit.json).')
_MODEL = model_flag.define('gemma3-270m', random=True)
_DTYPE = flags.DEFINE_enum('dtype', 'bfloat16', ['float32', 'bfloat16'], 'Compute and cache dtype.')
_PREFIX = flags.DEFINE_integer('prefix_tokens', 1024, 'Tokens in the block (BOS included).')
_CONTINUATION = flags.DEFINE_integer('continuation_tokens', 32, 'Tokens after the block.')
_CHUNK = flags.DEFINE_integer('chunk_size', 64, 'Tokens per forward call.')
_OUT = flags.DEFINE_string('out', None, 'Result JSON of a graft (default: DIR/graft.json).')
_IMPLS = impl_flags.define(default='pallas')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if _MODE.value is None or _DIR.value is None:
    raise app.UsageError('--mode and --dir are required')
  model = _IMPLS.apply(gemma_model.load_named(_MODEL.value, dtype=jnp.dtype(_DTYPE.value)))
  folder = pathlib.Path(_DIR.value)
  if _MODE.value == 'deposit':
    settings = portable_block.Settings(
      prefix_tokens=_PREFIX.value,
      continuation_tokens=_CONTINUATION.value,
      chunk_size=_CHUNK.value,
    )
    result = portable_block.deposit(
      model, model_name=_MODEL.value, settings=settings, folder=folder
    )
  else:
    result = portable_block.graft(model, model_name=_MODEL.value, folder=folder)
    results.write(_OUT.value or folder / 'graft.json', result)
  print(portable_block.verdict(result))


if __name__ == '__main__':
  cli.run(main)
