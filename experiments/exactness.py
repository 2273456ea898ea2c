r"""Byte-exact graft: fresh vs grafted logits on real text, with the fresh-vs-fresh floor.

    python experiments/exactness.py --model=gemma3-270m --samples=50 \
        --dtype=float32 --dtype=bfloat16 --out=experiments/results/exactness/exactness_cpu.json

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

import pathlib

from absl import app
from absl import flags

from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.graft import graft_gate
from graftjax.studies.common import results

_MODEL = model_flag.define('gemma3-270m', random=True)
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
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/exactness/exactness.json', 'Result JSON path.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  command = results.command_line()
  runs = [
    graft_gate.experiment(
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
  table = '\n\n'.join(graft_gate.format_table(r) for r in runs)
  table_path = pathlib.Path(_OUT.value).with_suffix('.txt')
  table_path.parent.mkdir(parents=True, exist_ok=True)
  table_path.write_text(table + '\n')
  print(table)
  results.write(
    _OUT.value, {**results.header('exactness', command=command), 'runs': runs}, outputs=[table_path]
  )


if __name__ == '__main__':
  cli.run(main)
