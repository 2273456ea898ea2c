"""Fresh vs grafted: the arms of the byte-exactness experiment.

For one text sample (prefix + continuation):
  fresh     a new context prefills the prefix, then processes the continuation;
  deposit   another new context prefills the prefix; its state is captured
            as a block and put in the store;
  grafted   a third new context grafts the block read back from the store,
            then processes the continuation;
Every arm uses the same cache capacity and the same chunk schedule (the
prefix in chunks from slot 0, the continuation in chunks from the prefix's
end), so fresh and grafted run the same compiled programs on the same
shapes. After the continuation, each arm decodes a greedy rollout.

`experiment(...)` is experiments/exactness.py for one dtype (model, samples,
store, result header); `format_table` prints its summary.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import subprocess
import sys
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from graftjax import blocks
from graftjax import exactness
from graftjax import ledger
from graftjax import restore as restore_lib
from graftjax import store as store_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import sampler
from graftjax.studies.common import corpus
from graftjax.studies.common import results


@dataclasses.dataclass(frozen=True)
class Schedule:
  """How every arm processes a sample.

  Attributes:
    chunk_size: tokens per forward call, for prefix and continuation.
    rollout_tokens: greedy tokens decoded after the continuation.
    capacity: cache slots (prefix + continuation + rollout at least).
  """

  chunk_size: int
  rollout_tokens: int
  capacity: int

  def check(self, sample: corpus.TextSample) -> None:
    need = len(sample.prefix_ids) + len(sample.continuation_ids) + self.rollout_tokens
    if need > self.capacity:
      raise ValueError(f'sample needs {need} slots, capacity is {self.capacity}')


@dataclasses.dataclass(frozen=True)
class ArmOutput:
  """What one arm produced.

  Attributes:
    logits: [Tc, V] float32 logits of the continuation tokens.
    rollout_tokens: greedy tokens after the continuation.
    rollout_logits: [R, V] float32 logits each rollout token was chosen from.
  """

  logits: np.ndarray
  rollout_tokens: tuple[int, ...]
  rollout_logits: np.ndarray | None


def prefill_prefix(model, sample: corpus.TextSample, schedule: Schedule):
  """A new context with the prefix processed (no logits): the cache."""
  schedule.check(sample)
  cache = model.init_cache(capacity=schedule.capacity)
  _, cache = model.prefill(
    sample.prefix_ids, cache=cache, chunk_size=schedule.chunk_size, logits='none'
  )
  return cache


def continue_and_roll_out(
  model, cache, sample: corpus.TextSample, schedule: Schedule, *, rollout: bool = True
) -> ArmOutput:
  """Processes the continuation after the prefix, then a greedy rollout."""
  start = len(sample.prefix_ids)
  logits, cache = model.prefill(
    sample.continuation_ids,
    cache=cache,
    chunk_size=schedule.chunk_size,
    start_position=start,
    logits='all',
  )
  logits = np.asarray(logits[0])
  if not rollout or schedule.rollout_tokens == 0:
    return ArmOutput(logits=logits, rollout_tokens=(), rollout_logits=None)
  next_position = start + len(sample.continuation_ids)
  tokens, step_logits, steps, _ = sampler.decode(
    model.params,
    jnp.asarray(logits[-1:]),
    jnp.full((1,), next_position, jnp.int32),
    cache,
    jax.random.key(0),
    config=model.config,
    max_new_tokens=schedule.rollout_tokens,
    keep_logits=True,
    tables=model.tables,
  )
  n = int(steps)
  return ArmOutput(
    logits=logits,
    rollout_tokens=tuple(int(t) for t in np.asarray(tokens)[0, :n]),
    rollout_logits=np.asarray(step_logits)[0, :n],
  )


def fresh(
  model, sample: corpus.TextSample, schedule: Schedule, *, rollout: bool = True
) -> ArmOutput:
  return continue_and_roll_out(
    model, prefill_prefix(model, sample, schedule), sample, schedule, rollout=rollout
  )


def deposit(model, sample: corpus.TextSample, schedule: Schedule, store) -> str:
  """Prefills the prefix in a new context, captures it, stores it; returns the key."""
  cache = prefill_prefix(model, sample, schedule)
  block = blocks.capture(
    cache,
    blocks.Span(0, len(sample.prefix_ids)),
    token_ids=sample.prefix_ids,
    target=model.graft_target,
    chunk_size=schedule.chunk_size,
  )
  return store.put(block)


def grafted(
  model,
  sample: corpus.TextSample,
  schedule: Schedule,
  store,
  key: str,
  *,
  rollout: bool = True,
) -> ArmOutput:
  """A new context grafts the stored prefix block, then continues."""
  schedule.check(sample)
  cache = restore_lib.restore(
    store,
    key,
    model.init_cache(capacity=schedule.capacity),
    target=model.graft_target,
    token_ids=sample.prefix_ids,
    chunk_size=schedule.chunk_size,
  )
  return continue_and_roll_out(model, cache, sample, schedule, rollout=rollout)


def rollout_comparison(reference: ArmOutput, candidate: ArmOutput) -> dict[str, Any]:
  """Token-for-token and logit-byte comparison of two rollouts."""
  same_len = len(reference.rollout_tokens) == len(candidate.rollout_tokens)
  out = {
    'tokens_equal': reference.rollout_tokens == candidate.rollout_tokens,
    'length': len(reference.rollout_tokens),
    'sha256_logits_reference': ledger.sha256_array(reference.rollout_logits),
    'sha256_logits_candidate': ledger.sha256_array(candidate.rollout_logits),
  }
  out['logits_byte_equal'] = bool(
    same_len and out['sha256_logits_reference'] == out['sha256_logits_candidate']
  )
  if not out['tokens_equal']:
    first = next(
      (
        i
        for i, (a, b) in enumerate(zip(reference.rollout_tokens, candidate.rollout_tokens))
        if a != b
      ),
      min(len(reference.rollout_tokens), len(candidate.rollout_tokens)),
    )
    out['first_divergence'] = first
  return out


def sample_record(sample: corpus.TextSample) -> dict[str, Any]:
  return {
    'source': sample.source,
    'prefix_tokens': len(sample.prefix_ids),
    'continuation_tokens': len(sample.continuation_ids),
    'sha256_prefix_ids': ledger.sha256_tokens(sample.prefix_ids),
    'sha256_continuation_ids': ledger.sha256_tokens(sample.continuation_ids),
  }


def write_fresh(folder: pathlib.Path, arm) -> None:
  """Saves a fresh ArmOutput where a replay process can read it."""
  folder.mkdir(parents=True, exist_ok=True)
  np.save(folder / 'logits.npy', arm.logits, allow_pickle=False)
  if arm.rollout_logits is not None:
    np.save(folder / 'rollout_logits.npy', arm.rollout_logits, allow_pickle=False)
  (folder / 'rollout_tokens.json').write_text(json.dumps(list(arm.rollout_tokens)))


def read_fresh(folder: pathlib.Path):
  rollout_path = folder / 'rollout_logits.npy'
  return ArmOutput(
    logits=np.load(folder / 'logits.npy', allow_pickle=False),
    rollout_tokens=tuple(json.loads((folder / 'rollout_tokens.json').read_text())),
    rollout_logits=np.load(rollout_path, allow_pickle=False) if rollout_path.exists() else None,
  )


def compare_arms(fresh_out: ArmOutput, other: ArmOutput) -> dict[str, Any]:
  """Continuation-logit comparison plus, when both rolled out, the rollout comparison."""
  out = {'logits': exactness.compare(fresh_out.logits, other.logits).to_json()}
  if fresh_out.rollout_logits is not None and other.rollout_logits is not None:
    out['rollout'] = rollout_comparison(fresh_out, other)
  return out


def _replay_request(model, model_name, samples, keys, schedule, store_root, workdir):
  """What the child process (`graftjax.studies.graft.replay`) is asked to graft and compare."""
  workdir = pathlib.Path(workdir)
  return {
    'model': model_name,
    'dtype': jnp.dtype(model.dtype).name,
    'position_scheme': model.position_scheme,
    'model_fingerprint': model.fingerprint,
    'store': str(store_root),
    'schedule': dataclasses.asdict(schedule),
    'out': str(workdir / 'replay_out.json'),
    'samples': [
      {
        'source': s.source,
        'prefix_ids': list(s.prefix_ids),
        'continuation_ids': list(s.continuation_ids),
        'key': key,
        'fresh_dir': str(workdir / f'fresh_{i}'),
      }
      for i, (s, key) in enumerate(zip(samples, keys))
    ],
  }


def _replay(request, workdir):
  """Runs `graftjax.studies.graft.replay` on `request` in a child process; returns its report."""
  workdir = pathlib.Path(workdir)
  (workdir / 'replay_request.json').write_text(json.dumps(request))
  proc = subprocess.run(
    [sys.executable, '-m', 'graftjax.studies.graft.replay', str(workdir / 'replay_request.json')],
    capture_output=True,
    text=True,
    check=False,
  )
  if proc.returncode:
    raise RuntimeError(f'replay process failed ({proc.returncode}):\n{proc.stderr[-4000:]}')
  return json.loads((workdir / 'replay_out.json').read_text())


def run_gate(
  *,
  model,
  model_name: str,
  samples: list[corpus.TextSample],
  schedule: Schedule,
  store,
  workdir,
  other_process: bool = True,
  release=None,
  progress=None,
) -> dict[str, Any]:
  """The experiment: per sample, fresh vs grafted, fresh vs fresh, other process.

  Args:
    model: a loaded Gemma.
    model_name: name `load_named` accepts (for the other process).
    samples: real-text samples.
    schedule: chunking, rollout length and cache capacity.
    store: a BlockStore the blocks are deposited in.
    workdir: scratch folder for the other process's inputs.
    other_process: also run the grafted arm in a child process.
    release: optional callable run once the in-process arms are done, before the child
      starts (e.g. to free the device memory the child's own copy of the weights needs).
    progress: optional callable wrapping an iterable (e.g. tqdm).
  Returns:
    JSON-ready dict: per-sample records and a summary per comparison.
  """

  workdir = pathlib.Path(workdir)
  records, keys = [], []
  per_arm: dict[str, list[exactness.Comparison]] = {'fresh_vs_grafted': [], 'fresh_vs_fresh': []}
  rollouts = []
  iterate = progress(samples) if progress else samples
  for i, sample in enumerate(iterate):
    first = fresh(model, sample, schedule)
    second = fresh(model, sample, schedule, rollout=False)
    key = deposit(model, sample, schedule, store)
    graft = grafted(model, sample, schedule, store, key)
    if other_process:
      write_fresh(workdir / f'fresh_{i}', first)
    vs_graft = compare_arms(first, graft)
    vs_fresh = compare_arms(first, second)
    per_arm['fresh_vs_grafted'].append(exactness.Comparison(**vs_graft['logits']))
    per_arm['fresh_vs_fresh'].append(exactness.Comparison(**vs_fresh['logits']))
    rollouts.append(vs_graft['rollout'])
    keys.append(key)
    records.append(
      {
        **sample_record(sample),
        'block_key': key,
        'fresh_vs_grafted': vs_graft,
        'fresh_vs_fresh': vs_fresh,
      }
    )
  summary = {arm: exactness.summarize(c) for arm, c in per_arm.items()}
  summary['rollout_fresh_vs_grafted'] = {
    'tokens_equal': sum(r['tokens_equal'] for r in rollouts),
    'logits_byte_equal': sum(r['logits_byte_equal'] for r in rollouts),
    'samples': len(rollouts),
  }
  if other_process:
    request = _replay_request(model, model_name, samples, keys, schedule, store.root, workdir)
    if release is not None:
      release()
    report = _replay(request, workdir)
    comparisons = report['comparisons']
    for record, comparison in zip(records, comparisons):
      record['fresh_vs_grafted_other_process'] = comparison
    summary['fresh_vs_grafted_other_process'] = exactness.summarize(
      [exactness.Comparison(**c['logits']) for c in comparisons]
    )
    summary['rollout_fresh_vs_grafted_other_process'] = {
      'tokens_equal': sum(c['rollout']['tokens_equal'] for c in comparisons),
      'logits_byte_equal': sum(c['rollout']['logits_byte_equal'] for c in comparisons),
      'samples': len(comparisons),
    }
    summary['other_process_determinism'] = report['determinism']
  return {'samples': records, 'summary': summary}


def free_weights(model) -> None:
  """Frees `model`'s weights where they live (the model cannot compute afterwards)."""
  for leaf in jax.tree.leaves(model.params):
    leaf.delete()


def experiment(
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
  """experiments/exactness.py for one dtype: loads the model, builds the samples, runs the
  gate in a scratch folder (and `store_dir`, if given); the result with its header."""
  model = gemma_model.load_named(model_name, dtype=jnp.dtype(dtype))
  tokenizer = model.tokenizer
  text = corpus.text_samples(
    tokenizer, count=samples, prefix_tokens=prefix_tokens, continuation_tokens=continuation_tokens
  )
  need = prefix_tokens + continuation_tokens + rollout_tokens
  schedule = Schedule(
    chunk_size=chunk_size,
    rollout_tokens=rollout_tokens,
    capacity=-(-need // chunk_size) * chunk_size,
  )
  inputs = results.model_inputs(model, model_name)
  position_scheme = model.position_scheme
  with tempfile.TemporaryDirectory() as scratch:
    store = store_lib.BlockStore(store_dir or pathlib.Path(scratch) / 'store')
    result = run_gate(
      model=model,
      model_name=model_name,
      samples=text,
      schedule=schedule,
      store=store,
      workdir=scratch,
      other_process=other_process,
      # The child loads its own copy: a 31B model fits one GPU once, not twice.
      release=functools.partial(free_weights, model),
      progress=lambda it: tqdm.tqdm(it, desc='samples', unit='sample'),
    )
  return {
    **results.header('exactness', inputs=inputs, command=command),
    'model': model_name,
    'dtype': dtype,
    'position_scheme': position_scheme,
    'schedule': {
      'chunk_size': chunk_size,
      'rollout_tokens': rollout_tokens,
      'capacity': schedule.capacity,
      'prefix_tokens': prefix_tokens,
      'continuation_tokens': continuation_tokens,
    },
    **result,
  }


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
