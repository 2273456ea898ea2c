r"""Position sensitivity: relocated grafts vs fresh computation, per scheme, dtype and offset.

    python experiments/relocation.py --model=gemma3-270m --scheme=rope --scheme=rope_f64 \
        --scheme=rope_relative --dtype=float32 --dtype=bfloat16 --samples=3 \
        --out=experiments/results/relocation/relocation_270m.json

For each scheme, dtype, offset M and sample (a block of --block_tokens
tokens of a Python standard-library file, then --continuation_tokens more):
the relocated graft (block computed at 0, moved to M) vs fresh(M); the
graft-free control fresh(0) vs fresh(M); the own-position graft vs fresh(M),
which must be byte-equal. A composition section grafts the block's two
halves side by side at --composition_offsets. See `graftjax.studies.position.position_sweep`.

--model is 'gemma3-270m', 'tiny', or a checkpoint folder written by
experiments/train_small.py (then --scheme defaults to the scheme it was
trained with, and the result carries its held-out loss). Writes the result
JSON (with its SHA-256, the command, the pinned configuration, model
fingerprints and every sample's token digests) and a PNG of the same stem.
"""

from graftjax import determinism

determinism.pin()  # before jax starts

import pathlib

from absl import app
from absl import flags

from graftjax.models.gemma import schemes
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.position import plots
from graftjax.studies.position import position_sweep
from graftjax.studies.common import results

_MODEL = model_flag.define(
  'gemma3-270m', help_text='Model (a train_small.py checkpoint folder too).'
)
_SCHEMES = flags.DEFINE_multi_enum(
  'scheme',
  None,
  list(schemes.names()),
  "Position schemes (repeat); default: a checkpoint's own scheme, else every registered one.",
)
_OFFSETS = flags.DEFINE_list(
  'offsets', ['0', '1', '7', '64', '512', '4096', '16384', '32000'], 'Block offsets M.'
)
_SAMPLES = flags.DEFINE_integer('samples', 3, 'Text samples (one stdlib file each).')
_DTYPES = flags.DEFINE_multi_enum(
  'dtype', ['float32'], ['float32', 'bfloat16'], 'Compute and cache dtypes (repeat).'
)
_BLOCK_TOKENS = flags.DEFINE_integer('block_tokens', 128, 'Tokens in the block (BOS included).')
_CONTINUATION_TOKENS = flags.DEFINE_integer('continuation_tokens', 32, 'Tokens after the block.')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 128, 'Tokens per forward call, every arm.')
_COMPOSITION_OFFSETS = flags.DEFINE_list(
  'composition_offsets',
  ['64:4096', '512:32000'],
  'A:B offsets of the two half-blocks grafted side by side (empty: no composition).',
)
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/relocation/relocation.json', 'Result JSON path.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = position_sweep.experiment(
    model=_MODEL.value,
    schemes=_SCHEMES.value,
    dtypes=_DTYPES.value,
    offsets=[int(m) for m in _OFFSETS.value],
    samples=_SAMPLES.value,
    block_tokens=_BLOCK_TOKENS.value,
    continuation_tokens=_CONTINUATION_TOKENS.value,
    chunk_size=_CHUNK_SIZE.value,
    composition_offsets=position_sweep.parse_pairs(_COMPOSITION_OFFSETS.value),
  )
  png = pathlib.Path(_OUT.value).with_suffix('.png')
  plots.plot_sensitivity(result, png)
  print(position_sweep.format_table(result))
  results.write(_OUT.value, result, outputs=[png])


if __name__ == '__main__':
  cli.run(main)
