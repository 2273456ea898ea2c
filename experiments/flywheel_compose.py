r"""Composition of routed library blocks, measured: exactness and what it buys.

    python experiments/flywheel_compose.py --model=gemma3-270m --impl=pallas --templates=0,1,2 \
        --queries=3 --held_out=0 --out=experiments/results/flywheel_compose/flywheel_compose_cpu.json

The GSM8K items of the chosen GSM-Symbolic templates are deposited (the base
model's own verified solution with --base_tokens > 0, else the dataset's
reference solution when it verifies); each is asked again after its own block
and k - 1 BM25-routed distractors composed side by side (rope_relative,
block-attention segments, Pallas kernels): the query's logits against a fresh
block-attention prefill of the same layout (SHA-256), packed and shifted by a
page, and the answers against the own block alone. New instances of the
templates (never deposited) are answered after the top-1 and the top-3 routed
blocks. XLA is refused (the reason is recorded).
"""

from graftjax import determinism

determinism.pin()  # before jax starts

from absl import app
from absl import flags

from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.flywheel import compose
from graftjax.studies.common import results

_MODEL = model_flag.define('gemma3-270m', ['gemma3-270m', 'tiny'], 'Model to run.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_IMPL = flags.DEFINE_enum('impl', 'pallas', ['xla', 'pallas'], 'Kernels (xla is refused).')
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/flywheel_compose/flywheel_compose.json', 'Result JSON.'
)
_TEMPLATES = flags.DEFINE_list(
  'templates', None, 'GSM-Symbolic template ids (0-99).', required=True
)
_PER_TEMPLATE = flags.DEFINE_integer('per_template', 1, 'Held-out instances per template.')
_QUERIES = flags.DEFINE_integer('queries', None, 'Recurring questions asked (default: all).')
_HELD_OUT = flags.DEFINE_integer('held_out', None, 'Held-out questions asked (default: all).')
_BASE_TOKENS = flags.DEFINE_integer(
  'base_tokens', 0, 'Base attempt budget (0: deposit reference solutions only).'
)
_ROWS = flags.DEFINE_integer('rows', 8, 'Rows per batch of base attempts.')
_CAPACITY = flags.DEFINE_integer('capacity', 2048, 'Slots of every composed cache.')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 16, 'Prefill chunk.')
_KS = flags.DEFINE_list('ks', ['1', '2', '3'], 'Blocks composed per recurring question.')
_HELD_OUT_KS = flags.DEFINE_list('held_out_ks', ['1', '3'], 'Blocks per held-out question.')
_RECALL_TOKENS = flags.DEFINE_integer('recall_tokens', 16, 'Recall answer budget.')
_SOLVE_TOKENS = flags.DEFINE_integer('solve_tokens', 256, 'Held-out answer budget.')
_LIBRARY = flags.DEFINE_string('library', None, 'Library folder (resumable; default: temporary).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the held-out instances.')
_DEADLINE_S = flags.DEFINE_float(
  'deadline_s', None, 'Ask no further question after this many seconds (counted in the result).'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = compose.experiment(
    compose.Settings(
      model_name=_MODEL.value,
      dtype=_DTYPE.value,
      impl=_IMPL.value,
      templates=[int(t) for t in _TEMPLATES.value],
      per_template=_PER_TEMPLATE.value,
      queries=_QUERIES.value,
      held_out=_HELD_OUT.value,
      base_tokens=_BASE_TOKENS.value,
      rows=_ROWS.value,
      setup=compose.Setup(
        capacity=_CAPACITY.value,
        chunk_size=_CHUNK_SIZE.value,
        ks=tuple(int(k) for k in _KS.value),
        held_out_ks=tuple(int(k) for k in _HELD_OUT_KS.value),
        recall_tokens=_RECALL_TOKENS.value,
        solve_tokens=_SOLVE_TOKENS.value,
      ),
      library_dir=_LIBRARY.value,
      seed=_SEED.value,
      deadline_s=_DEADLINE_S.value,
    )
  )
  print(compose.format_summary(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
