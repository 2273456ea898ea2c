r"""Does a block computed alone keep its bits when it moves to another slot? Per attention impl.

    python experiments/slot_moves.py --model=gemma3-270m --tokens=40 --chunk_size=32 \
        --capacity=1024 --slots=1,64,256,300,512,768 \
        --out=experiments/results/paging/slot_moves_cpu.json

A block prefilled alone at slot 0 against the same tokens prefilled fresh at each slot (in
segment 1 after empty slots), under plain XLA attention and the split-invariant 'xla_split'
(rope_relative, float32): layers whose k or v differ, and by how much. See
graftjax/studies/paging/slot_moves.py and docs/composition.md.
"""

from graftjax import determinism

determinism.pin()

from absl import app
from absl import flags
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.paging import paging_scale
from graftjax.studies.common import results
from graftjax.studies.paging import slot_moves

_MODEL = model_flag.define('gemma3-270m', paging_scale.MODELS, 'Model.')
_IMPLS = flags.DEFINE_list('attention', ['xla', 'xla_split'], 'Attention impls (xla, xla_split).')
_TOKENS = flags.DEFINE_integer('tokens', 40, 'Tokens of the block.')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 32, 'Prefill chunk.')
_CAPACITY = flags.DEFINE_integer('capacity', 1024, 'Cache slots.')
_SLOTS = flags.DEFINE_list('slots', ['1', '64', '256', '300', '512', '768'], 'Slots moved to.')
_OUT = flags.DEFINE_string('out', 'experiments/results/paging/slot_moves.json', 'Result JSON.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = slot_moves.experiment(
    model_name=_MODEL.value,
    impls=_IMPLS.value,
    tokens=_TOKENS.value,
    chunk_size=_CHUNK_SIZE.value,
    capacity=_CAPACITY.value,
    slots=[int(s) for s in _SLOTS.value],
  )
  for row in result['rows']:
    print(
      f'{row["attention"]:9s} slot {row["slot"]:5d}: {row["layers_differ"]} of {row["layers"]}'
      f' layers differ, max |dk| {row["max_abs_dk"]:.2e}'
    )
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
