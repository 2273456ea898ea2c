r"""Routers that abstain: thresholds fitted on a calibration split, reported on a disjoint one.

    python experiments/route_calibration.py --task=gsm8k --templates=0-2,4-6,8 --unrelated=146 \
        --out=OUT
    python experiments/route_calibration.py --task=qa_wikidata --pairs=140 --out=OUT

The committed run (experiments/results/flywheel/study.toml has its command) uses the 70
GSM-Symbolic templates of the H200 flywheel run; the other 30 enumerate millions of
combinations before sampling (minutes each).

A flywheel task's deposited questions are indexed by BM25 and by the model's
embeddings; deposited, reworded (held-out, labelled with their deposited item)
and unrelated questions are each halved by a seeded shuffle; each router's
threshold is fitted on one half under --max_false_hit on the unrelated ones (by
default on their Wilson 95% upper limit, which needs at least 73 unrelated questions in
the half: --unrelated=146 for gsm8k; with fewer a router is recorded as not fitted, with
the reason), and reported on the other half (hit rates, false-hit rate, Wilson 95%, and
whether the held-out false-hit rate's upper limit meets the bound). Details:
graftjax/studies/flywheel/route_calibration.py.
"""

from graftjax import determinism

determinism.pin()  # before jax starts

from absl import app
from absl import flags

from graftjax.models.gemma import model as gemma_model
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.flywheel import harness
from graftjax.studies.common import results
from graftjax.studies.flywheel import route_calibration

_MODEL = model_flag.define('gemma3-270m', help_text='Model of the embeddings.')
_TASK = flags.DEFINE_string('task', 'gsm8k', f'One of {", ".join(harness.TASKS)}, or module:Name.')
_TEMPLATES = flags.DEFINE_string(
  'templates', '', 'gsm8k: GSM-Symbolic template ids (0-99), e.g. 0-2,4.'
)
_PAIRS = flags.DEFINE_integer('pairs', 140, 'qa_wikidata: subjects (deposited + held-out pairs).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the task and of the split.')
_MAX_FALSE_HIT = flags.DEFINE_float('max_false_hit', 0.05, 'Bound on false hits in the fit.')
_CONSERVATIVE = flags.DEFINE_bool(
  'conservative', True, 'Bound the Wilson 95% upper limit of false hits, not the point estimate.'
)
_UNRELATED = flags.DEFINE_integer(
  'unrelated', None, 'gsm8k: unrelated questions (default: one per template; 146 bound 5%).'
)
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/flywheel/route_calibration.json', 'Result JSON path.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  task = harness.load_task(
    _TASK.value,
    templates=route_calibration.template_ids(_TEMPLATES.value),
    pairs=_PAIRS.value,
    seed=_SEED.value,
    unrelated=_UNRELATED.value,
  )
  model = gemma_model.load_named(_MODEL.value)
  result = route_calibration.experiment(
    task,
    route_calibration.routers(model),
    seed=_SEED.value,
    max_false_hit=_MAX_FALSE_HIT.value,
    conservative=_CONSERVATIVE.value,
    header=results.header(
      'route_calibration',
      inputs=harness.result_inputs(model, _MODEL.value, list(task.items())[:1]),
    ),
  )
  print(route_calibration.format_rows(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
