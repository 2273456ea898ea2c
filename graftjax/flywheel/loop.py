"""The flywheel loop: solve, verify, deposit, route, graft, answer.

`run` takes the base model's attempts at a task's items (batched, few-shot),
deposits a verified solution of every item it can (the model's own where it
solved the item, else the dataset's reference when that verifies: its worked
solution, or its answer where it has none), then asks two kinds of question
through the library:

  recurrence  the same items the base model did not solve, routed by exact
              question text to their block, answered in recall mode;
  transfer    held-out items (never deposited), routed to the nearest
              deposited question, answered in solve mode with that block as
              the worked example (recall mode for one-line answers), against
              the base model on the same items.

Every attempt keeps its raw text, token ids and verdict, so
`graftjax.flywheel.rescore` re-checks the result without a model; with a
`Journal` (the studies' `journal.Journal`), an interrupted run resumes from its
finished steps. The built-in tasks are in `graftjax.flywheel.tasks`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import contextlib
import dataclasses
import json
import time
from typing import Any, ContextManager, Protocol

from graftjax import ledger
from graftjax import store as store_lib
from graftjax.flywheel import answer as answer_lib
from graftjax.flywheel import library as library_lib
from graftjax.flywheel import solve
from graftjax.flywheel import summary as summary_lib
from graftjax.flywheel import tasks
from graftjax.flywheel import verifiers
from graftjax.models.gemma import sampler
from graftjax.routing import route as route_lib


Prompt = tasks.Prompt


class Journal(Protocol):
  """Finished steps of a run by name (`journal.Journal` of the studies writes them to a file)."""

  def step(
    self, name: str, compute: Callable[[], Any], *, check: Callable[[Any], str | None] | None = None
  ) -> Any:
    """The value of step `name`: a journaled one once `check` passes it, else `compute()`."""


class Meter(Protocol):
  """Measures named phases of a run (the studies' `energy.Meter`)."""

  def phase(self, name: str, *, answers: int) -> ContextManager[None]:
    """Measures the block; `answers` divides the phase into per-answer figures."""

  def to_json(self) -> dict[str, Any]:
    """The measured phases, JSON-ready."""


class _Unjournaled:
  """Every step computed, its value as a journal would read it back (JSON)."""

  def step(self, name, compute, *, check=None):
    del name, check  # nothing is read back
    return json.loads(json.dumps(compute(), allow_nan=False))


UNJOURNALED = _Unjournaled()


@dataclasses.dataclass(frozen=True)
class Budget:
  """What each phase may spend.

  Attributes:
    samples: base attempts per item (the first greedy, the rest sampled).
    temperature: temperature of the sampled attempts.
    max_new_tokens: decode budget of a base attempt and of a transfer answer.
    recall_tokens: decode budget of a recurrence answer.
    rows: rows per batch of the base model's attempts.
    seed: PRNG seed of the sampled attempts.
  """

  samples: int = 1
  temperature: float = 0.7
  max_new_tokens: int = 256
  recall_tokens: int = 16
  rows: int = 8
  seed: int = 0


def base_attempts(
  model,
  items: Sequence[Any],
  verify: Callable,
  *,
  prompt: Prompt,
  budget: Budget,
  phase: str,
  progress: Callable[[int], None] | None = None,
  journal: Journal | None = None,
) -> list[dict[str, Any]]:
  """The base model's attempts (few-shot prefix, then the question), verified.

  In the chat form (`Prompt.chat`) the prefix and the query are one user turn of the model's
  chat template, the answer its turn (`answer.chat_frame`). With a `journal`, each sample's
  batched outputs are a step (`{phase}/generated/{sample}`) before any is verified, so a
  verifier that raises loses no model work: the rerun verifies the journaled outputs.
  """
  journal = journal or UNJOURNALED
  head, tail, add_bos = '', '', True
  if prompt.chat:
    head, tail, _ = answer_lib.chat_frame(model)
    add_bos = not head.startswith(model.tokenizer.chat_template.bos_token)
  prefix_ids = model.tokenizer.encode(head + prompt.prefix, add_bos=add_bos)
  prompts = [
    model.tokenizer.encode(prompt.query.format(question=item.question) + tail, add_bos=False)
    for item in items
  ]
  stops = answer_lib.stop_ids(model, prompt.base_mode, chat=prompt.chat)
  records = []

  def generate(sample):
    sampling = sampler.SamplingConfig(temperature=budget.temperature if sample else 0.0)
    start = time.perf_counter()
    outputs = solve.generate(
      model,
      prompts,
      max_new_tokens=budget.max_new_tokens,
      stop_ids=stops,
      sampling=sampling,
      seed=budget.seed + sample,
      prefix_ids=prefix_ids,
      rows=budget.rows,
      progress=progress,
    )
    seconds = (time.perf_counter() - start) / max(len(items), 1)
    return {'token_ids': [[int(t) for t in ids] for ids in outputs], 'seconds': seconds}

  for sample in range(budget.samples):
    done = journal.step(
      f'{phase}/generated/{sample}',
      lambda sample=sample: generate(sample),
      check=_generated_check(len(items)),
    )
    seconds = done['seconds']
    for item, ids in zip(items, done['token_ids']):
      text = model.tokenizer.decode(ids, skip_special=True)
      records.append(_record(phase, item, sample, ids, text, verify(text, item.gold), seconds))
  return records


def run(
  model,
  task: tasks.Task,
  *,
  library: library_lib.Library,
  budget: Budget,
  routers: Sequence[route_lib.Router] = (),
  progress: Callable[[str, int], Callable[[int], None]] | None = None,
  meter: Meter | None = None,
  journal: Journal | None = None,
  conservative: bool = False,
) -> dict[str, Any]:
  """The whole loop on a task's items (deposited) and held-out items (never deposited).

  Everything a run needs is checked before the model is asked anything: the
  task has items, its verifier is registered, held-out items are disjoint from
  the deposited ones and have a router. A task without held-out items runs
  base, deposits and recurrence only (no transfer phase); its routers are
  then fitted and reported on its deposited, reworded and unrelated questions
  if it has reworded or unrelated ones.

  Args:
    model: the frozen `Gemma`.
    task: the `tasks.Task`: items, prompt, verifier, optional held-out items.
    library: where blocks and the catalog go (resumable).
    budget: what each phase may spend.
    routers: routers for transfer; the first is used to answer, every one
      is evaluated. Needed only when the task has held-out items. A router
      without a threshold is fitted in the run (`route.calibrate`); one other
      than the first that cannot be is left out of `routing`, its reason in
      `routing_refused`.
    progress: `progress(phase, total)` returns a callback taking a count.
    meter: if given, measures each phase (`Meter`: the studies' `energy.Meter`).
    journal: finished steps (the base phases whole, answers one by one);
      a restarted run with the same journal skips them.
    conservative: fit thresholds so that the Wilson upper limit of the false-hit
      rate, not its point estimate, is at most 5% (`route.calibrate`).
  Returns:
    JSON-ready dict: attempts, deposits, routing (each fit's `held_out` bound under
    `calibration`), the answering `router` and a summary per phase.
  Raises:
    tasks.TaskError: the task cannot be run as given (nothing was run), e.g. too few
      unrelated questions to bound the answering router's false hits conservatively.
    verifiers.VerifierError: its verifier is not registered.
  """
  items, held_out, prompt, verify = _checked(task, routers, conservative)
  bar = progress or (lambda phase, total: None)
  journal = journal or UNJOURNALED

  def measured(name, answers):
    return meter.phase(name, answers=answers) if meter else contextlib.nullcontext()

  with measured('base', len(items) * budget.samples):
    base = journal.step(
      'base',
      check=_attempts_check({it.id for it in items}),
      compute=lambda: base_attempts(
        model,
        items,
        verify,
        prompt=prompt,
        budget=budget,
        phase='base',
        progress=bar('base attempts', len(items) * budget.samples),
        journal=journal,
      ),
    )
  form = 'code' if prompt.code else 'answer' if prompt.answer_only else 'solution'
  deposits = deposit_verified(
    model, library, items, verify, base, form=form, progress=bar('deposits', len(items))
  )
  by_item = {e.item_id: e for e in library.entries() if e.task == task.name}
  unsolved = [it for it in items if not _solved(base, it.id) and it.id in by_item]
  exact = route_lib.ExactRouter()
  exact.add_many((e.key, e.question) for e in by_item.values())
  ask = _Ask(model, library, verify, journal, bar, measured, chat=prompt.chat)
  recurrence = _recurrence(ask, unsolved, exact, budget, prompt.recall_mode)
  transfer = {'attempts': [], 'routing': {}, 'refused': {}}
  if held_out:
    transfer = _transfer(ask, held_out, routers, prompt, budget, task, conservative)
  elif task.reworded or task.unrelated:
    transfer['routing'] = _fitted_routing(
      routers, library.entries(), task, budget.seed, bar, conservative
    )
  return {
    'task': task.name,
    'verifier': {'name': verify.name, 'version': verify.version},
    'budget': dataclasses.asdict(budget),
    'prompt': {
      **dataclasses.asdict(prompt),
      'prefix_sha256': ledger.sha256_bytes(prompt.prefix.encode()),
    },
    'deposits': deposits,
    'attempts': base + recurrence['attempts'] + transfer['attempts'],
    'router': type(routers[0]).__name__ if held_out else None,
    'routing': transfer['routing'],
    **({'routing_refused': transfer['refused']} if transfer['refused'] else {}),
    'grafted_vs_prompted': recurrence['grafted_vs_prompted'],
    'summary': summary_lib.summarize(
      base, recurrence['attempts'], transfer['attempts'], [it.id for it in unsolved]
    ),
    'energy': meter.to_json() if meter else None,
  }


ZERO_SHOT = Prompt(prefix='', query=answer_lib.MODES['solve'])
MAX_FALSE_HIT = 0.05  # the bound on false hits of every threshold fitted in a run


def check_task(task: tasks.Task) -> tuple[list[Any], list[Any], Prompt, Any]:
  """(items, held_out, prompt, verifier) of `task`, or why it cannot run, before any model work.

  Every item's gold (deposited and held out) is checked here, so a gold the verifier refuses
  is named now, not after the base phase: the verifier runs on the first item's reference (its
  solution, else its answer), then checks every other item's gold with its `check_gold` when
  it has one (the code verifier's runs no sandbox), else runs on that item's reference too.

  Raises:
    tasks.TaskError: the task cannot be run as given, naming the cause.
    verifiers.VerifierError: its verifier is not registered.
  """
  verify = task.checker
  if not isinstance(getattr(verify, 'name', None), str) or not isinstance(
    getattr(verify, 'version', None), int
  ):
    raise tasks.TaskError(
      f'task {task.name!r}: its verifier {verify!r} has no name and version to record'
      ' (make it with verifiers.register)'
    )
  items = list(task.items())
  if not items:
    raise tasks.TaskError(f'task {task.name!r} has no items')
  held_out = task.held_out_items()
  if overlap := {it.id for it in items} & {it.id for it in held_out}:
    raise tasks.TaskError(f'held-out items are also deposited items: {sorted(overlap)[:5]}')
  if task.targets is not None:
    ids, held_ids = {it.id for it in items}, {it.id for it in held_out}
    if wrong := sorted(h for h, d in task.targets.items() if h not in held_ids or d not in ids):
      raise tasks.TaskError(
        f'task {task.name!r}: targets {wrong[:5]} pair no held-out item with a deposited one'
      )
  prompt = task.prompt or ZERO_SHOT
  if '{question}' not in prompt.query:
    raise tasks.TaskError(f'the prompt query {prompt.query!r} has no {{question}} field')
  if prompt.keep_prefix and prompt.query != answer_lib.MODES[prompt.transfer_mode]:
    raise tasks.TaskError(
      f'keep_prefix needs the {prompt.transfer_mode} query'
      f' {answer_lib.MODES[prompt.transfer_mode]!r} as the prompt, got {prompt.query!r}'
    )
  if empty := [it.id for it in [*items, *held_out] if not it.question.strip()]:
    raise tasks.TaskError(f'task {task.name!r}: items with an empty question: {empty[:5]}')
  check_gold = getattr(verify, 'check_gold', None)
  for i, item in enumerate([*items, *held_out]):
    cheap = i > 0 and check_gold is not None
    with verifiers.plugin_failures(
      f'task {task.name!r}: its verifier {verify.name} v{verify.version} fails on item'
      f' {item.id} ({"its gold" if cheap else "its reference answer"})',
      tasks.TaskError,
    ):
      if cheap:
        check_gold(item.gold)
      else:
        verify(item.solution if item.solution is not None else item.answer, item.gold)
  return items, held_out, prompt, verify


def _checked(
  task: tasks.Task, routers, conservative: bool = False
) -> tuple[list[Any], list[Any], Prompt, Any]:
  """`check_task`, and a router for held-out items that can be fitted if it must."""
  items, held_out, prompt, verify = check_task(task)
  if held_out and not routers:
    raise tasks.TaskError(f'task {task.name!r} has held-out items: transfer needs a router')
  unfitted = [type(r).__name__ for r in routers if r.threshold is None]
  if held_out and unfitted and len(items) < 2 and len(held_out) < 2:
    raise tasks.TaskError(
      f'{unfitted} have no threshold and {len(items)} + {len(held_out)} items are too few to'
      ' fit one on a split of their own'
    )
  if held_out and conservative and routers[0].threshold is None:
    queries = route_lib.Queries(  # the most the fit can have: every item deposited
      deposited=[(it.question, it.id) for it in items],
      reworded=[(it.question, it.id) for it in held_out],
      unrelated=list(task.unrelated()) if task.unrelated else [],
    )
    try:
      route_lib.check_bound(queries, max_false_hit=MAX_FALSE_HIT)
    except route_lib.BoundError as e:
      raise tasks.TaskError(
        f'task {task.name!r}: the answering {type(routers[0]).__name__}: {e}; give it a'
        ' threshold, more unrelated questions, or fit the point estimate'
      ) from e
  return items, held_out, prompt, verify


def _record(phase, item, sample, ids, text, verdict, seconds, **extra) -> dict[str, Any]:
  ids = [int(t) for t in ids]
  return {
    'phase': phase,
    'item_id': item.id,
    'sample': sample,
    'question': item.question,
    'gold': str(item.answer),
    'text': text,
    'token_ids': ids,
    'token_ids_sha256': ledger.sha256_tokens(ids),
    'decode_tokens': len(ids),
    'verdict': verdict.to_json(),
    'seconds': float(seconds),
    **extra,
  }


def _solved(base, item_id) -> bool:
  return any(r['verdict']['verdict'] for r in base if r['item_id'] == item_id)


def deposit_verified(
  model,
  library: library_lib.Library,
  items: Sequence[Any],
  verify: Callable,
  base: Sequence[dict[str, Any]] = (),
  *,
  form: str = 'solution',
  progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
  """Deposits each item's own verified attempt, else the dataset's reference; one record each.

  Args:
    model: the frozen `Gemma` the blocks are computed with.
    library: where they go; an item it already holds is marked `existing` (an earlier run's).
    items: the items to deposit.
    verify: `verify(text, gold) -> verifiers.Verdict`.
    base: the model's attempts (`base_attempts` records), or none: every deposit is the
      reference (the item's solution, else its answer; `source: reference`).
    form: `library.FORMS`: 'solution', 'answer' or 'code'.
    progress: called with 1 after each item.
  Returns:
    Per item: `item_id`, `key`, `source` and `block_tokens`, or `key: None` and why it was
    `refused` (a refusal is recorded, not raised).
  """
  out = []
  for item in items:
    existing = library.find(item.task, item.id) is not None
    own = [r for r in base if r['item_id'] == item.id and r['verdict']['verdict']]
    tokens = sum(r['decode_tokens'] for r in base if r['item_id'] == item.id)
    if own:
      solution, source, record = own[0]['text'], 'self', own[0]['verdict']
    else:  # the loaders already drop GSM8K's calculator annotations (<<2*3=6>>)
      reference = item.solution if item.solution is not None else item.answer
      solution, source, record = reference, 'reference', None
    try:
      entry = library.deposit(
        model,
        item=item,
        verifier=verify,
        solution=solution,
        source=source,
        tokens_spent=tokens,
        record=record,
        form=form,
      )
      out.append(
        {
          'item_id': item.id,
          'key': entry.key,
          'source': entry.source,
          'block_tokens': entry.block_tokens,
          **({'existing': True} if existing else {}),
        }
      )
    except library_lib.DepositError as e:
      out.append({'item_id': item.id, 'key': None, 'source': source, 'refused': str(e)})
    if progress:
      progress(1)
  return out


@dataclasses.dataclass(frozen=True)
class _Ask:
  """What every question through the library needs: model, library, verifier, journal, meters."""

  model: Any
  library: library_lib.Library
  verify: Callable
  journal: Journal
  bar: Callable
  measured: Callable
  chat: bool = False  # questions in the chat form (`Prompt.chat`)


def _recurrence(ask: _Ask, unsolved, exact, budget, mode) -> dict[str, Any]:
  """Each unsolved item asked again: exact route, graft, recall; then the same text prompted.

  The two arms run one after the other, so each phase's energy is its own.
  Logits are compared by the SHA-256 of their float32 bytes (a resumed run
  has only those).
  """
  tick = ask.bar('recurrence', len(unsolved))
  entries = {e.key: e for e in ask.library.entries()}
  attempts = []
  with ask.measured('recurrence', len(unsolved)):
    for item in unsolved:
      attempts.append(
        ask.journal.step(
          f'recurrence/{item.id}',
          lambda item=item: _routed_answer(
            ask, 'recurrence', item, exact, entries, mode, budget.recall_tokens
          ),
          check=_answer_check(ask, item, entries),
        )
      )
      if tick:
        tick(1)
  grafted = [(item, a) for item, a in zip(unsolved, attempts) if a['answered_by'] == 'flywheel']

  def prompted(item, entry):
    out = answer_lib.answer_prompted(
      ask.model,
      ask.library,
      entry,
      item.question,
      mode=mode,
      max_new_tokens=budget.recall_tokens,
      chat=ask.chat,
    )
    return {
      'token_ids': list(out.token_ids),
      'first_logits_sha256': ledger.sha256_bytes(out.first_logits.tobytes()),
      'seconds': out.seconds,
    }

  tick = ask.bar('recurrence: prompted', len(grafted))
  others = []
  with ask.measured('recurrence_prompted', len(grafted)):
    for item, a in grafted:
      others.append(
        ask.journal.step(
          f'recurrence_prompted/{item.id}',
          lambda item=item, a=a: prompted(item, entries[a['block_key']]),
          check=_prompted_check,
        )
      )
      if tick:
        tick(1)
  equal = [
    {
      'item_id': item.id,
      'logits_byte_equal': a['first_logits_sha256'] == other['first_logits_sha256'],
      'tokens_equal': a['token_ids'] == other['token_ids'],
      'graft_logits_sha256': a['first_logits_sha256'],
      'prompted_logits_sha256': other['first_logits_sha256'],
      'graft_seconds': a['seconds'],
      'prompted_seconds': other['seconds'],
      'context_tokens': entries[a['block_key']].block_tokens,
    }
    for (item, a), other in zip(grafted, others)
  ]
  summary = summary_lib.grafted_vs_prompted(equal)
  return {'attempts': attempts, 'grafted_vs_prompted': {'summary': summary, 'items': equal}}


def _transfer(ask: _Ask, held_out, routers, prompt, budget, task, conservative=False):
  """Held-out items: the base model (few-shot) against the routed block.

  A router without a threshold is first calibrated (`route.calibrate`, seeded
  by the budget's seed) on the task's deposited questions, the held-out
  questions labelled with their targets and the task's unrelated questions;
  its routing records the fit. A router other than the first (which answers)
  that no threshold fits is left out, with the reason, in `refused`.
  """
  targets = task.targets
  entries = {e.key: e for e in ask.library.entries()}
  for router in routers:
    router.add_many((e.key, e.question) for e in entries.values())
  calibrations, refused = {}, {}
  unfitted = sum(r.threshold is None for r in routers)
  tick = ask.bar('transfer: router calibration', unfitted) if unfitted else None
  for router in routers:
    if router.threshold is None:
      queries = route_lib.Queries(
        deposited=[(e.question, e.key) for e in entries.values() if e.task == task.name],
        reworded=[(q, k) for q, k in _labelled(held_out, entries, targets) if k is not None],
        unrelated=list(task.unrelated()) if task.unrelated else [],
      )
      try:
        calibrations[type(router).__name__] = route_lib.calibrate(
          router, queries, seed=budget.seed, max_false_hit=MAX_FALSE_HIT, conservative=conservative
        ).to_json()
      except route_lib.FitError as e:
        if router is routers[0]:
          raise
        refused[type(router).__name__] = str(e)
      if tick:
        tick(1)
  with ask.measured('transfer_base', len(held_out)):
    attempts = ask.journal.step(
      'transfer_base',
      check=_attempts_check({it.id for it in held_out}),
      compute=lambda: base_attempts(
        ask.model,
        held_out,
        ask.verify,
        prompt=prompt,
        budget=dataclasses.replace(budget, samples=1),
        phase='transfer_base',
        progress=ask.bar('transfer: base', len(held_out)),
        journal=ask.journal,
      ),
    )
  preamble = prompt.prefix if prompt.keep_prefix else ''
  tick = ask.bar('transfer: flywheel', len(held_out))
  with ask.measured('transfer_flywheel', len(held_out)):
    for item in held_out:
      attempts.append(
        ask.journal.step(
          f'transfer_flywheel/{item.id}',
          lambda item=item: _routed_answer(
            ask,
            'transfer_flywheel',
            item,
            routers[0],
            entries,
            prompt.transfer_mode,
            budget.max_new_tokens,
            preamble,
          ),
          check=_answer_check(ask, item, entries),
        )
      )
      if tick:
        tick(1)
  routing = {}
  for r in routers:
    name = type(r).__name__
    if name in refused:
      continue
    evaluation = route_lib.evaluate(r, _labelled(held_out, entries, targets), r.threshold)
    routing[name] = evaluation.to_json()
    if name in calibrations:
      routing[name]['calibration'] = calibrations[name]
  return {'attempts': attempts, 'routing': routing, 'refused': refused}


def _fitted_routing(routers, entries, task, seed, bar, conservative=False) -> dict[str, Any]:
  """Without held-out items: each router without a threshold fitted on half of the task's
  deposited questions (to their blocks), reworded questions and unrelated ones, and reported on
  the other half (`route.calibrate`); a router no threshold fits records why."""
  by_item = {e.item_id: e.key for e in entries if e.task == task.name}
  reworded = list(task.reworded()) if task.reworded else []
  queries = route_lib.Queries(
    deposited=[(e.question, e.key) for e in entries if e.task == task.name],
    reworded=[(q, by_item[i]) for q, i in reworded if i in by_item],
    unrelated=list(task.unrelated()) if task.unrelated else [],
  )
  out = {}
  unfitted = sum(r.threshold is None for r in routers)
  tick = bar('router calibration', unfitted) if unfitted else None
  for router in routers:
    if router.threshold is not None:
      continue
    router.add_many((e.key, e.question) for e in entries)
    name = type(router).__name__
    try:
      fit = route_lib.calibrate(
        router, queries, seed=seed, max_false_hit=MAX_FALSE_HIT, conservative=conservative
      )
      out[name] = {'calibration': fit.to_json()}
    except ValueError as e:
      out[name] = {'calibration': None, 'refused': str(e)}
    if tick:
      tick(1)
  return out


def _labelled(held_out, entries, targets) -> list[tuple[str, str | None]]:
  """Each held-out question with the key of the deposited item it was paired with; None
  (abstain) for one `targets` leaves out, or without `targets` one whose template is not
  deposited."""
  by_item = {}
  for e in entries.values():
    by_item.setdefault(e.item_id, e.key)
  return [
    (it.question, by_item.get(targets.get(it.id) if targets is not None else it.template))
    for it in held_out
  ]


def _routed_answer(ask: _Ask, phase, item, router, entries, mode, max_new_tokens, preamble=''):
  """The item routed, its block grafted and the answer verified: an attempt record.

  A query that routes to nothing, or whose block fails the store's checks
  (reported and skipped), is answered by the base model and marked so.
  """
  hits = router.route(item.question)
  entry = entries[hits[0].key] if hits else None

  def answer(block):
    return answer_lib.answer(
      ask.model,
      ask.library,
      block,
      item.question,
      mode=mode,
      max_new_tokens=max_new_tokens,
      preamble=preamble,
      chat=ask.chat,
    )

  who = 'base (routed to nothing)'
  out = None
  if entry is not None:
    try:
      out = answer(entry)
      who = 'flywheel'
    except store_lib.StoreError as e:
      who = f'base (block {entry.key[:12]} skipped: {type(e).__name__})'
  if out is None:
    out = answer(None)
  return _record(
    phase,
    item,
    0,
    out.token_ids,
    out.text,
    ask.verify(out.text, item.gold),
    out.seconds,
    block_key=entry.key if who == 'flywheel' else None,
    route_score=hits[0].score if hits else None,
    context_tokens=out.context_tokens,
    answered_by=who,
    first_logits_sha256=ledger.sha256_bytes(out.first_logits.tobytes()),
  )


# What a resumed run checks before it uses a journaled step (`journal.Journal.step`'s `check`):
# each returns None if the value still holds, else why not.

_RECORD = {  # fields of an attempt record the loop reads, and their JSON types
  'item_id': str,
  'text': str,
  'token_ids': list,
  'decode_tokens': int,
  'verdict': dict,
  'seconds': (int, float),
}
_ANSWER = {'answered_by': str, 'first_logits_sha256': str, 'context_tokens': int}
_PROMPTED = {'token_ids': list, 'first_logits_sha256': str, 'seconds': (int, float)}


def _wrong_field(value: Any, fields: Mapping[str, Any]) -> str | None:
  if not isinstance(value, dict):
    return f'is a JSON {type(value).__name__}, not an object'
  for name, kind in fields.items():
    if not isinstance(value.get(name), kind) or isinstance(value.get(name), bool):
      return f'has {name} {str(value.get(name))[:40]!r} of the wrong type'
  return None


def _record_cause(value: Any, ids: set[str]) -> str | None:
  if cause := _wrong_field(value, _RECORD):
    return cause
  if value['item_id'] not in ids:
    return f"is an attempt at item {value['item_id']!r}, not one of this run's"
  if not isinstance(value['verdict'].get('verdict'), bool):
    return 'has a verdict without its boolean verdict'
  return None


def _attempts_check(ids: set[str]) -> Callable[[Any], str | None]:
  """A journaled list of attempt records at items `ids`."""

  def check(value):
    if not isinstance(value, list):
      return f'is a JSON {type(value).__name__}, not a list of attempts'
    for i, record in enumerate(value):
      if cause := _record_cause(record, ids):
        return f'attempt {i} {cause}'
    return None

  return check


def _prompted_check(value: Any) -> str | None:
  return _wrong_field(value, _PROMPTED)


def _generated_check(count: int) -> Callable[[Any], str | None]:
  """A journaled sample of `base_attempts`: `count` lists of token ids and the seconds."""

  def check(value):
    if cause := _wrong_field(value, {'token_ids': list, 'seconds': (int, float)}):
      return cause
    rows = value['token_ids']
    if len(rows) != count:
      return f'holds {len(rows)} outputs for {count} items'
    if not all(isinstance(r, list) and all(type(t) is int for t in r) for r in rows):
      return 'holds an output that is not a list of token ids'
    return None

  return check


def _answer_check(ask: _Ask, item, entries) -> Callable[[Any], str | None]:
  """A journaled `_routed_answer` record of `item`; the block it names, against the store."""

  def check(value):
    if cause := _record_cause(value, {item.id}) or _wrong_field(value, _ANSWER):
      return cause
    key = value.get('block_key')
    if value['answered_by'] != 'flywheel':
      return None if key is None else f'is answered by {value["answered_by"]!r} yet names {key!r}'
    if not isinstance(key, str) or key not in entries:
      return f'names block {str(key)[:70]!r}, which the library at {ask.library.root} does not hold'
    try:
      meta = ask.library.store.get(key).meta
    except store_lib.StoreError as e:
      return f'names block {key}, which the store cannot give: {e}'
    if ask.model is not None and meta.model_fingerprint != ask.model.fingerprint:
      return (
        f"names block {key} of model {meta.model_fingerprint}; this run's model is"
        f' {ask.model.fingerprint}'
      )
    if value['context_tokens'] != len(meta.token_ids):
      return (
        f"says block {key} gave {value['context_tokens']} context tokens; the block's own"
        f' metadata in the store holds {len(meta.token_ids)} tokens'
      )
    return None

  return check
