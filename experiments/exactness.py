r"""Byte-exact graft: fresh vs grafted logits on real text, with the fresh-vs-fresh floor.

    python experiments/exactness.py --model=gemma3-270m --samples=50 \
        --dtype=float32 --dtype=bfloat16 --out=experiments/results/exactness_cpu.json

For each sample (prefix and continuation from a Python standard-library
file), a fresh context prefills the prefix and processes the continuation;
another context deposits the prefix state as a block in a tensorstore
BlockStore; a third grafts the block read back from the store and
continues; a child process (which only reads the store) does the same.
Reports the SHA-256 of each arm's logit bytes, byte-equal counts, KL in
float64, argmax agreement, and a greedy rollout compared token-for-token
and logit-byte-for-byte. The pinned deterministic configuration is
recorded in the result.
"""

from graftjax import determinism

determinism.pin()  # before jax starts

import pathlib  # pylint: disable=g-import-not-at-top,wrong-import-position
import tempfile

from absl import app
from absl import flags
import jax.numpy as jnp
import tqdm

from graftjax.studies import cli
from graftjax.studies import corpus
from graftjax.studies import graft_gate
from graftjax.studies import results
from graftjax import store as store_lib
from graftjax.models.gemma import gguf as gguf_lib
from graftjax.models.gemma import model as gemma_model

_MODEL = flags.DEFINE_enum('model', 'gemma3-270m', ['gemma3-270m', 'tiny'], 'Model to run.')
_SAMPLES = flags.DEFINE_integer('samples', 50, 'Number of text samples.')
_PREFIX_TOKENS = flags.DEFINE_integer(
  'prefix_tokens', 256, 'Tokens in the grafted prefix (BOS included).'
)
_CONTINUATION_TOKENS = flags.DEFINE_integer(
  'continuation_tokens', 32, 'Tokens processed after the graft.'
)
_ROLLOUT_TOKENS = flags.DEFINE_integer(
  'rollout_tokens', 128, 'Greedy tokens decoded after the continuation.'
)
_CHUNK_SIZE = flags.DEFINE_integer(
  'chunk_size', 64, 'Tokens per forward call (prefix and continuation).'
)
_DTYPES = flags.DEFINE_multi_enum(
  'dtype', ['float32'], ['float32', 'bfloat16'], 'Compute and cache dtypes (repeat for several).'
)
_OTHER_PROCESS = flags.DEFINE_bool('other_process', True, 'Also graft in a separate process.')
_STORE = flags.DEFINE_string('store', None, 'BlockStore folder (default: a temporary one).')
_OUT = flags.DEFINE_string('out', 'experiments/results/exactness.json', 'Result JSON path.')


def format_table(result: dict) -> str:
  """A short human-readable table of one run's summary."""
  s = result['summary']
  rows = [('arm', 'byte-equal', 'KL max', 'argmax', 'max|Δ|')]
  for arm in ('fresh_vs_grafted', 'fresh_vs_grafted_other_process', 'fresh_vs_fresh'):
    if arm in s:
      a = s[arm]
      rows.append(
        (
          arm,
          f'{a["byte_equal"]}/{a["samples"]}',
          f'{a["kl_max"]:.3g}',
          f'{100 * a["argmax_agreement"]:.1f}%',
          f'{a["max_abs_diff"]:.3g}',
        )
      )
  for arm in ('rollout_fresh_vs_grafted', 'rollout_fresh_vs_grafted_other_process'):
    if arm in s:
      a = s[arm]
      rows.append(
        (
          arm,
          f'{a["logits_byte_equal"]}/{a["samples"]}',
          '-',
          f'tokens {a["tokens_equal"]}/{a["samples"]}',
          '-',
        )
      )
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ['  '.join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
  header = (
    f'{result["model"]} {result["dtype"]} on {result["determinism"]["device_kind"]}'
    f' ({result["determinism"]["backend"]}, jax {result["determinism"]["jax_version"]})'
  )
  return '\n'.join([header] + lines)


def run(
  *,
  model_name: str,
  samples: int,
  prefix_tokens: int,
  continuation_tokens: int,
  rollout_tokens: int,
  chunk_size: int,
  dtype: str,
  other_process: bool,
  store_dir: str | None,
  command: str,
) -> dict:
  """Loads the model, builds samples, runs the gate; returns the result dict."""
  model = gemma_model.load_named(model_name, dtype=jnp.dtype(dtype))
  tokenizer = model.tokenizer or corpus.ByteTokenizer(model.config.vocab_size)
  text = corpus.text_samples(
    tokenizer, count=samples, prefix_tokens=prefix_tokens, continuation_tokens=continuation_tokens
  )
  need = prefix_tokens + continuation_tokens + rollout_tokens
  schedule = graft_gate.Schedule(
    chunk_size=chunk_size,
    rollout_tokens=rollout_tokens,
    capacity=-(-need // chunk_size) * chunk_size,
  )
  with tempfile.TemporaryDirectory() as scratch:
    store = store_lib.BlockStore(store_dir or pathlib.Path(scratch) / 'store')
    result = graft_gate.run_gate(
      model=model,
      model_name=model_name,
      samples=text,
      schedule=schedule,
      store=store,
      workdir=scratch,
      other_process=other_process,
      progress=lambda it: tqdm.tqdm(it, desc='samples', unit='sample'),
    )
  inputs = {'model_fingerprint': model.fingerprint, 'params_sha256': model.params_digest}
  if model_name != 'tiny':
    inputs['gguf_sha256'] = gguf_lib.expected_sha256()
  return {
    **results.header('exactness', inputs=inputs, command=command),
    'model': model_name,
    'dtype': dtype,
    'position_scheme': model.position_scheme,
    'schedule': {
      'chunk_size': chunk_size,
      'rollout_tokens': rollout_tokens,
      'capacity': schedule.capacity,
      'prefix_tokens': prefix_tokens,
      'continuation_tokens': continuation_tokens,
    },
    **result,
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  command = results.command_line()
  runs = [
    run(
      model_name=_MODEL.value,
      samples=_SAMPLES.value,
      prefix_tokens=_PREFIX_TOKENS.value,
      continuation_tokens=_CONTINUATION_TOKENS.value,
      rollout_tokens=_ROLLOUT_TOKENS.value,
      chunk_size=_CHUNK_SIZE.value,
      dtype=dtype,
      other_process=_OTHER_PROCESS.value,
      store_dir=_STORE.value,
      command=command,
    )
    for dtype in _DTYPES.value
  ]
  table = '\n\n'.join(format_table(r) for r in runs)
  table_path = pathlib.Path(_OUT.value).with_suffix('.txt')
  table_path.write_text(table + '\n')
  print(table)
  results.write(
    _OUT.value, {**results.header('exactness', command=command), 'runs': runs}, outputs=[table_path]
  )


if __name__ == '__main__':
  cli.run(main)
