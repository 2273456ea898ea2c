r"""Position sensitivity: relocated grafts vs fresh computation, per scheme, dtype and offset.

    python experiments/relocation.py --model=gemma3-270m --scheme=rope --scheme=rope_f64 \
        --scheme=rope_relative --dtype=float32 --dtype=bfloat16 --samples=3 \
        --out=experiments/results/relocation_270m.json

For each scheme, dtype, offset M and sample (a block of --block_tokens
tokens of a Python standard-library file, then --continuation_tokens more):
the relocated graft (block computed at 0, moved to M) vs fresh(M); the
graft-free control fresh(0) vs fresh(M); the own-position graft vs fresh(M),
which must be byte-equal. A composition section grafts the block's two
halves side by side at --composition_offsets. See `graftjax.studies.position_sweep`.

--model is 'gemma3-270m', 'tiny', or a checkpoint folder written by
experiments/train_small.py (then --scheme defaults to the scheme it was
trained with, and the result carries its held-out loss). Writes the result
JSON (with its SHA-256, the command, the pinned configuration, model
fingerprints and every sample's token digests) and a PNG of the same stem.
"""

from graftjax import determinism

determinism.pin()  # before jax starts

from collections.abc import Callable  # pylint: disable=g-import-not-at-top,wrong-import-position
import functools
import os
import pathlib

from absl import app
from absl import flags
import jax.numpy as jnp
import tqdm

from graftjax.models.gemma import gguf as gguf_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.studies import cli
from graftjax.studies import corpus
from graftjax.studies import plots
from graftjax.studies import position_sweep
from graftjax.studies import results
from graftjax.studies import training

_MODEL = flags.DEFINE_string(
  'model', 'gemma3-270m', "'gemma3-270m', 'tiny', or a train_small.py checkpoint folder."
)
_SCHEMES = flags.DEFINE_multi_enum(
  'scheme',
  None,
  list(position_sweep.ALL_SCHEMES),
  "Position schemes (repeat); default: a checkpoint's own scheme, else all five.",
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
_OUT = flags.DEFINE_string('out', 'experiments/results/relocation.json', 'Result JSON path.')

NAMED_MODELS = ('gemma3-270m', 'tiny')


def parse_pairs(values: list[str]) -> list[tuple[int, int]]:
  """['64:4096', ...] -> [(64, 4096), ...]."""
  pairs = []
  for value in values:
    a, sep, b = value.partition(':')
    if not sep:
      raise ValueError(f'composition offsets must look like A:B, got {value!r}')
    pairs.append((int(a), int(b)))
  return pairs


def model_source(model: str) -> tuple[Callable[[str], gemma_model.Gemma], dict]:
  """(dtype name -> Gemma, what to record about the model's origin)."""
  if model in NAMED_MODELS:
    load = lambda dtype: gemma_model.load_named(model, dtype=jnp.dtype(dtype))
    info = {'gguf_sha256': gguf_lib.expected_sha256()} if model != 'tiny' else {}
    return load, info
  if not os.path.isdir(model):
    raise ValueError(f'--model={model!r} is neither {NAMED_MODELS} nor a checkpoint folder')
  record = training.load_record(model)
  info = {
    'checkpoint': model,
    'training': {
      k: record[k]
      for k in (
        'result_sha256',
        'command',
        'size',
        'parameter_count',
        'held_out_loss',
        'held_out_bits_per_byte',
        'held_out_tokens',
        'params_sha256',
        'model_fingerprint',
      )
      if k in record
    },
  }
  info['training']['scheme'] = record['config']['position_scheme']
  info['training']['steps'] = record['settings']['steps']
  return lambda dtype: training.load_trained(model, dtype=jnp.dtype(dtype)), info


def run(
  *,
  model: str,
  schemes: list[str] | None,
  dtypes: list[str],
  offsets: list[int],
  samples: int,
  block_tokens: int,
  continuation_tokens: int,
  chunk_size: int,
  composition_offsets: list[tuple[int, int]],
  command: str | None = None,
) -> dict:
  """Builds the samples and the model factory, runs the sweep; returns the result dict."""
  load, info = model_source(model)
  base = functools.cache(load)
  if schemes is None:
    schemes = (
      [info['training']['scheme']] if 'training' in info else list(position_sweep.ALL_SCHEMES)
    )
  tokenizer = base(dtypes[0]).tokenizer or corpus.ByteTokenizer(base(dtypes[0]).config.vocab_size)
  text = corpus.text_samples(
    tokenizer, count=samples, prefix_tokens=block_tokens, continuation_tokens=continuation_tokens
  )
  result = position_sweep.run_sweep(
    model_factory=lambda scheme, dtype: base(dtype).with_position_scheme(scheme),
    schemes=schemes,
    dtypes=dtypes,
    offsets=offsets,
    samples=text,
    layout=position_sweep.layout_for(
      block_tokens=block_tokens, continuation_tokens=continuation_tokens, chunk_size=chunk_size
    ),
    composition_offsets=composition_offsets,
    progress=lambda it: tqdm.tqdm(it, desc='relocation', unit='item'),
  )
  head = results.header('relocation', inputs=info, command=command)
  return {
    **head,
    'model': os.path.basename(os.path.normpath(model)),
    'device': head['determinism']['device_kind'],
    **result,
  }


def format_table(result: dict) -> str:
  """Byte-equal counts and worst KL per scheme, dtype and offset."""
  lines = [
    f'{result["model"]} on {result["device"]}:',
    '  scheme dtype offset | relocated eq  KL max  max|Δ|  flips | control eq  KL max | own eq',
  ]
  for c in result['cells']:
    r, f, o = c['relocated'], c['control'], c['own_position']
    lines.append(
      f'  {c["scheme"]:13s} {c["dtype"]:8s} {c["offset"]:6d} | {r["byte_equal"]}/{r["samples"]}'
      f'  {r["kl_max"]:.3g}  {r["max_abs_diff"]:.3g}  {r["argmax_flips"]} |'
      f' {f["byte_equal"]}/{f["samples"]}  {f["kl_max"]:.3g} | {o["byte_equal"]}/{o["samples"]}'
    )
  for c in result['composition']:
    lines.append(
      f'  composition {c["scheme"]} {c["dtype"]} at {c["offsets"]}:'
      f' {c["byte_equal"]}/{c["samples"]} byte-equal, KL max {c["kl_max"]:.3g},'
      f' max|Δ| {c["max_abs_diff"]:.3g}'
    )
  return '\n'.join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = run(
    model=_MODEL.value,
    schemes=_SCHEMES.value,
    dtypes=_DTYPES.value,
    offsets=[int(m) for m in _OFFSETS.value],
    samples=_SAMPLES.value,
    block_tokens=_BLOCK_TOKENS.value,
    continuation_tokens=_CONTINUATION_TOKENS.value,
    chunk_size=_CHUNK_SIZE.value,
    composition_offsets=parse_pairs(_COMPOSITION_OFFSETS.value),
  )
  png = pathlib.Path(_OUT.value).with_suffix('.png')
  plots.plot_sensitivity(result, png)
  print(format_table(result))
  results.write(_OUT.value, result, outputs=[png])


if __name__ == '__main__':
  cli.run(main)
