"""The flywheel experiment's harness: its tasks by name, routers, progress bars, journal,
energy meter and result (experiments/flywheel.py). The loop itself is
`graftjax.flywheel.loop`; the built-in tasks are in `graftjax.flywheel.tasks`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
import contextlib
import dataclasses
from typing import Any

from graftjax.flywheel import library as library_lib
from graftjax.flywheel import loop
from graftjax.routing import route as route_lib
from graftjax.flywheel import tasks
from graftjax.flywheel.tasks import gsm8k
from graftjax.flywheel.tasks import qa_wikidata
from graftjax.studies.common import energy
from graftjax.studies.common import journal as journal_lib


def format_summary(summary: dict[str, Any]) -> str:
  """One line per phase: accuracy with its Wilson interval, decode tokens per answer."""
  lines = []
  for phase in ('base', 'recurrence', 'transfer_base', 'transfer_flywheel'):
    s = summary[phase]
    if not s.get('items'):
      lines.append(f'{phase:18s} no items')
      continue
    a = s['accuracy']
    lines.append(
      f'{phase:18s} {a["successes"]:4d}/{a["trials"]:<4d} = {a["rate"]:6.1%}'
      f'  [{a["low"]:.1%}, {a["high"]:.1%}]  {s["decode_tokens_per_answer"]:7.1f} decode tokens/answer'
    )
  lines.append(
    f'recurrence: {summary["recurrence_items"]} items the base model did not solve; it spent'
    f' {summary["recurrence_base_decode_tokens"]} decode tokens on them'
  )
  return '\n'.join(lines)


def format_routing(result: dict[str, Any]) -> str:
  """One line per router: whether it answered, its threshold, and for a threshold fitted in
  the run the false hits on the unrelated questions it was not fitted on, with their Wilson
  interval and whether its upper limit meets the bound; a router no threshold fitted, why."""
  lines = []
  for name, ev in sorted(result.get('routing', {}).items()):
    role = 'answers' if name == result.get('router') else 'evaluated'
    fit = ev.get('calibration')
    if not fit:
      lines.append(f'{name:>16} {role}  threshold {ev.get("threshold")} (given)')
      continue
    false_hit, bound = fit['report']['false_hit'], fit.get('held_out')
    held = 'no unrelated questions held out'
    if false_hit:
      held = (
        f'held-out false hits {false_hit["successes"]}/{false_hit["trials"]}'
        f' [{false_hit["low"]:.1%}, {false_hit["high"]:.1%}]'
      )
    said = ''
    if bound and false_hit:  # with none held out, `held` says so once
      said = f': bounded at {bound["max_false_hit"]:.1%}' if bound['met'] else f': {bound["why"]}'
    lines.append(f'{name:>16} {role}  threshold {fit["threshold"]} fitted; {held}{said}')
  for name, why in sorted(result.get('routing_refused', {}).items()):
    lines.append(f'{name:>16} not fitted: {why}')
  return '\n'.join(lines)


TASKS = ('gsm8k', 'qa_wikidata', 'humaneval')  # built in; any other: --task=package.module:Name


def load_task(
  spec: str,
  *,
  templates=(),
  per_template=1,
  pairs=60,
  shots=5,
  seed=0,
  unrelated=None,
  problems=None,
) -> tasks.Task:
  """The task `spec` names: a built-in (`TASKS`) or 'package.module:Name'.

  `Name` is a `tasks.Task`, or a function of no arguments that returns one (`tasks.load`:
  any failure of the user's code is a `tasks.TaskError` naming the spec). The built-ins
  take the other arguments (`tasks.gsm8k.task`, `tasks.qa_wikidata.task`,
  `humaneval.task(problems)`, None: its default count).
  """
  if problems is not None and spec != 'humaneval':
    raise tasks.TaskError(f'problems={problems} is a count of humaneval problems, not of {spec!r}')
  if spec == 'gsm8k':
    return gsm8k.task(templates, seed=seed, per_template=per_template, unrelated=unrelated)
  if spec == 'qa_wikidata':
    return qa_wikidata.task(pairs, seed=seed, shots=shots)
  if spec == 'humaneval':
    from graftjax.flywheel import humaneval

    return humaneval.task() if problems is None else humaneval.task(problems)
  if ':' not in spec:
    raise tasks.TaskError(f'task must be one of {TASKS} or package.module:Name, got {spec!r}')
  return tasks.load(spec)


def result_inputs(model, model_name: str, items: Sequence[Any]) -> dict[str, Any]:
  """A result's `inputs`: the model's (`results.model_inputs`) and the sources of `items`."""
  from graftjax.studies.common import results

  return {**results.model_inputs(model, model_name), 'items': sorted({i.source for i in items})}


@contextlib.contextmanager
def progress_bars() -> Iterator[Callable[[str, int], Callable[[int], None]]]:
  """A `progress(phase, total)` for `loop.run`: one tqdm bar a phase.

  A bar closes when its phase ends, so its time is the phase's: when it reaches its total,
  or when the next phase opens its bar (phases run one after another; a resumed phase
  never ticks); every bar is closed on exit.
  """
  import tqdm

  bars = []

  def progress(phase: str, total: int) -> Callable[[int], None]:
    for earlier in bars:
      earlier.close()
    bar = tqdm.tqdm(total=total, desc=phase, unit='item')
    bars.append(bar)

    def tick(count: int) -> None:
      bar.update(count)
      if bar.n >= bar.total:
        bar.close()

    return tick

  try:
    yield progress
  finally:
    for bar in bars:
      bar.close()


ROUTERS = ('bm25', 'exact', 'embedding')  # the experiment's routers, by --router name


def routers_for(
  model, answer: str, *, bm25_threshold: float | None = None
) -> list[route_lib.Router]:
  """The experiment's routers, the one named `answer` (of `ROUTERS`) first: it answers
  transfer, every one is evaluated. BM25 takes `bm25_threshold` (None: fitted in the run);
  the embedding router's threshold is fitted in the run.

  Raises:
    ValueError: `answer` is not in `ROUTERS`.
  """
  if answer not in ROUTERS:
    raise ValueError(f'router must be one of {ROUTERS}, got {answer!r}')
  made = {
    'bm25': lambda: route_lib.BM25Router(threshold=bm25_threshold),
    'exact': route_lib.ExactRouter,
    'embedding': lambda: route_lib.EmbeddingRouter(model),
  }
  return [made[name]() for name in sorted(ROUTERS, key=lambda name: name != answer)]


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `experiment` runs (experiments/flywheel.py builds it from its flags): its
  arguments, as its docstring describes them."""

  model_name: str
  dtype: str
  impl: str
  budget: loop.Budget
  capacity: int
  library_dir: str | None
  bm25_threshold: float | None
  measure_energy: bool
  task: str | tasks.Task = 'gsm8k'
  templates: Sequence[int] = ()
  per_template: int = 1
  pairs: int = 60
  shots: int = 5
  journal_path: str | None = None
  chat: bool = False
  router: str = 'bm25'
  conservative: bool = False
  unrelated: int | None = None
  problems: int | None = None


def experiment(
  settings: Settings,
) -> dict[str, Any]:
  """experiments/flywheel.py: the loop on one task's items, with progress bars.

  `task`: a `tasks.Task`, or a name for `load_task`: 'gsm8k' (GSM8K items of
  the GSM-Symbolic `templates`, new instances held out), 'qa_wikidata'
  (`pairs` subjects of BIG-bench qa_wikidata, `shots` few-shot examples), or
  'package.module:Name' (any importable task). `journal_path` makes the run
  resumable (refused with `measure_energy`, whose phases must be measured whole). `chat`
  asks every question in the model's chat template, whatever the task's prompt says
  (`Prompt.chat`). `router` answers transfer (`routers_for`); `conservative` fits
  thresholds by the Wilson upper limit of false hits (`loop.run`); `unrelated`: gsm8k's
  unrelated questions.
  """
  import tempfile

  import jax.numpy as jnp

  from graftjax.flywheel import datasets
  from graftjax.models.gemma import model as gemma_model
  from graftjax.studies.common import results

  if settings.measure_energy and (reason := energy.available()):
    raise RuntimeError(reason)
  if settings.measure_energy and settings.journal_path:
    raise ValueError('energy is measured over whole phases: run without a journal')
  task = spec = settings.task
  if not isinstance(task, tasks.Task):
    task = load_task(
      spec,
      templates=list(settings.templates),
      per_template=settings.per_template,
      pairs=settings.pairs,
      shots=settings.shots,
      seed=settings.budget.seed,
      unrelated=settings.unrelated,
      problems=settings.problems,
    )
  if settings.chat:
    task = dataclasses.replace(
      task, prompt=dataclasses.replace(task.prompt or loop.ZERO_SHOT, chat=True)
    )
  items, held_out, _, _ = loop.check_task(task)  # before the model loads
  model = gemma_model.load_named(
    settings.model_name, dtype=jnp.dtype(settings.dtype), impl=settings.impl
  )
  journal = journal_lib.Journal(
    settings.journal_path,
    config={
      'model': model.fingerprint,
      'dtype': settings.dtype,
      'impl': settings.impl,
      'task': task.name,
      'items': [i.id for i in items],
      'held_out': [i.id for i in held_out],
      # A plain-form prompt is recorded as before the chat form existed, so its journals resume.
      'prompt': {
        k: v
        for k, v in dataclasses.asdict(task.prompt or loop.ZERO_SHOT).items()
        if k != 'chat' or v
      },
      'budget': dataclasses.asdict(settings.budget),
      'capacity': settings.capacity,
      'bm25_threshold': settings.bm25_threshold,
      # Journals of runs before these settings (BM25 answering, point-estimate fits) resume.
      **({'router': settings.router} if settings.router != 'bm25' else {}),
      **({'conservative': True} if settings.conservative else {}),
    },
  )
  if journal.resumed:
    print(f'resuming: {journal.resumed} finished steps from {settings.journal_path}')
  meter = energy.Meter() if settings.measure_energy else None
  with progress_bars() as progress, tempfile.TemporaryDirectory() as scratch:
    library = library_lib.Library(
      settings.library_dir or f'{scratch}/library',
      shape=library_lib.Shape(capacity=settings.capacity),
    )
    out = loop.run(
      model,
      task,
      library=library,
      budget=settings.budget,
      routers=routers_for(model, settings.router, bm25_threshold=settings.bm25_threshold),
      progress=progress,
      meter=meter,
      journal=journal,
      conservative=settings.conservative,
    )
    library.close()
  inputs = result_inputs(model, settings.model_name, items[:1] + held_out[:1])
  if (task.prompt or loop.ZERO_SHOT).chat:
    inputs['chat_template_sha256'] = model.tokenizer.chat_template.digest()
  if spec == 'qa_wikidata':
    inputs['bigbench_sdist_sha256'] = datasets.BIGBENCH_SHA256
  return {
    **results.header('flywheel', inputs=inputs),
    'model': settings.model_name,
    'dtype': settings.dtype,
    'impl': settings.impl,
    **({} if isinstance(spec, tasks.Task) or spec in TASKS else {'task_spec': spec}),
    **task.record,
    **({'resumed_steps': journal.resumed} if journal.resumed else {}),
    **out,
  }
