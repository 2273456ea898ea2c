r"""Answer latency at a repeated length against unseen lengths, in a bucket and across buckets.

    python experiments/bench_answer.py \
        --out=experiments/results/flywheel/bench_answer_cpu.json

Arithmetic questions padded to chosen query lengths are deposited in a library
(capacity 256, chunk 64: the question-answering run's shape) and answered through
their blocks: an item at the base length, the same item again, then items of
unseen lengths in the same 64-token bucket and beyond it. `bucketed` is the
flywheel's answer (query padded to the bucket); `unbucketed` prefills the query
unpadded, one program per length, as answers were computed before. Goal: an
unseen length in a bucket within 1.5x of a repeated one. Details:
graftjax/studies/flywheel/bench_answer.py.
"""

from graftjax import determinism

determinism.pin()  # before jax starts

from absl import app
from absl import flags

from graftjax.models.gemma import model as gemma_model
from graftjax.studies.flywheel import bench_answer
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import results

_MODEL = model_flag.define('gemma3-270m', ['gemma3-270m', 'tiny'], 'Model to run.')
_BASE = flags.DEFINE_integer('base_length', 24, 'Query tokens of the repeated item.')
_IN_BUCKET = flags.DEFINE_list(
  'in_bucket', ['20', '28', '33', '41', '47', '53'], 'Unseen query lengths in its bucket.'
)
_ACROSS = flags.DEFINE_list('across', ['70', '77', '90'], 'Unseen query lengths beyond it.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Answers of the base item after its first.')
_CAPACITY = flags.DEFINE_integer('capacity', 256, 'Library cache slots.')
_CHUNK = flags.DEFINE_integer('chunk_size', 64, 'Library chunk (the query bucket).')
_MAX_NEW_TOKENS = flags.DEFINE_integer('max_new_tokens', 8, 'Decode budget per answer.')
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/flywheel/bench_answer.json', 'Result JSON path.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = bench_answer.experiment(
    gemma_model.load_named(_MODEL.value),
    model_name=_MODEL.value,
    base_length=_BASE.value,
    in_bucket=[int(n) for n in _IN_BUCKET.value],
    across=[int(n) for n in _ACROSS.value],
    repeats=_REPEATS.value,
    capacity=_CAPACITY.value,
    chunk_size=_CHUNK.value,
    max_new_tokens=_MAX_NEW_TOKENS.value,
  )
  print(bench_answer.format_rows(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
