"""Position sensitivity: relocated grafts, the graft-free control, own-position grafts.

For each position scheme, dtype, offset M and text sample (a block of n
tokens, then a continuation of c tokens), three arms are compared with
fresh(M), the block and continuation computed fresh at offset M:

  relocated     the block computed alone at offset 0, moved to M, grafted,
                continued (`relocation.relocated_to`);
  control       fresh(0): the model's own sensitivity to the offset, with no
                graft involved (the graft-free control);
  own_position  the block computed at M, grafted there unchanged; must be
                byte-equal at every offset and under every scheme.

Composition: the block's two halves A and B are computed alone, moved to
two offsets and grafted side by side; compared with fresh block attention
(`relocation.composed_fresh` vs `relocation.composed_grafted`).

Every arm runs on one `relocation.Layout` (capacity n + c: slots do not
depend on positions, so a block at offset 32000 still sits in slots
0..n-1). KL is float64, KL(fresh(M) || arm) per continuation row.

`experiment(...)` is experiments/relocation.py: the model by name or from a
trained checkpoint (`model_source`), the samples, the sweep and the result
header; `format_table` prints its cells.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
import dataclasses
import functools
import os
import pathlib
from typing import Any

import jax.numpy as jnp
import numpy as np
import tqdm

from graftjax import exactness
from graftjax import ledger
from graftjax.models.gemma import gguf as gguf_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import positions as positions_lib
from graftjax.models.gemma import schemes as schemes_lib
from graftjax.studies.common import corpus
from graftjax.studies.position import relocation
from graftjax.studies.common import results
from graftjax.studies.position import training

ARMS = ('relocated', 'control', 'own_position')
REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
# Where committed results live, relative to the repository root (searched recursively).
COMMITTED_RESULTS = pathlib.Path('experiments') / 'results'

ModelFactory = Callable[[str, str], Any]  # (scheme, dtype) -> Gemma
Progress = Callable[[Iterable], Iterable]


@dataclasses.dataclass(frozen=True)
class _Task:
  """One unit of work: one sample at one offset (or one composition pair)."""

  scheme: str
  dtype: str
  sample: int
  offset: int | None = None
  pair: tuple[int, int] | None = None


def layout_for(
  *, block_tokens: int, continuation_tokens: int, chunk_size: int
) -> relocation.Layout:
  """The smallest layout every arm fits: capacity n + c."""
  return relocation.Layout(capacity=block_tokens + continuation_tokens, chunk_size=chunk_size)


def figures(reference: np.ndarray, candidate: np.ndarray) -> dict[str, Any]:
  """One comparison of logits [T, V]: byte equality, KL, max |Δ|, argmax flips, digests.

  Byte-equal arrays skip the float64 work (at the real vocabulary, about a
  second per comparison): their KL, |Δ| and flips are exactly 0.
  """
  ref, cand = np.asarray(reference), np.asarray(candidate)
  if ref.shape == cand.shape and ref.dtype == cand.dtype and ref.tobytes() == cand.tobytes():
    digest = ledger.sha256_array(ref)
    return {
      'byte_equal': True,
      'kl_mean': 0.0,
      'kl_max': 0.0,
      'max_abs_diff': 0.0,
      'argmax_flips': 0,
      'rows': int(ref.size // ref.shape[-1]),
      'sha256_reference': digest,
      'sha256_candidate': digest,
    }
  c = exactness.compare(ref, cand)
  flips = ref.argmax(-1) != cand.argmax(-1)
  return {
    'byte_equal': c.byte_equal,
    'kl_mean': c.kl_mean,
    'kl_max': c.kl_max,
    'max_abs_diff': c.max_abs_diff,
    'argmax_flips': int(flips.sum()),
    'rows': c.rows,
    'sha256_reference': c.sha256_reference,
    'sha256_candidate': c.sha256_candidate,
  }


def summarize(per_sample: list[dict[str, Any]]) -> dict[str, Any]:
  """Totals over samples (every sample has the same number of rows)."""
  return {
    'samples': len(per_sample),
    'byte_equal': sum(f['byte_equal'] for f in per_sample),
    'kl_mean': float(np.mean([f['kl_mean'] for f in per_sample])),
    'kl_max': max(f['kl_max'] for f in per_sample),
    'max_abs_diff': max(f['max_abs_diff'] for f in per_sample),
    'argmax_flips': sum(f['argmax_flips'] for f in per_sample),
    'rows': sum(f['rows'] for f in per_sample),
    'per_sample': per_sample,
  }


def _check(samples, layout, offsets, pairs) -> None:
  """Raises ValueError if samples, layout or offsets do not fit together."""
  if not samples:
    raise ValueError('no samples')
  lengths = {(len(s.prefix_ids), len(s.continuation_ids)) for s in samples}
  if len(lengths) != 1:
    raise ValueError(f'samples differ in (block, continuation) length: {sorted(lengths)}')
  ((n, c),) = lengths
  if n + c > layout.capacity:
    raise ValueError(f'block {n} + continuation {c} exceed capacity {layout.capacity}')
  if n < 2 and pairs:
    raise ValueError('composition needs a block of at least 2 tokens')
  if min(offsets, default=0) < 0:
    raise ValueError(f'offsets must be >= 0, got {list(offsets)}')
  for a, b in pairs:
    if a < 0 or b < a + n // 2:
      raise ValueError(
        f'composition offsets ({a}, {b}): B must start after A ends ({n // 2} tokens)'
      )


def _tasks(schemes, dtypes, offsets, pairs, num_samples) -> list[_Task]:
  out = []
  for dtype in dtypes:
    for scheme in schemes:
      out += [_Task(scheme, dtype, i, offset=m) for m in offsets for i in range(num_samples)]
      out += [_Task(scheme, dtype, i, pair=p) for p in pairs for i in range(num_samples)]
  return out


def _model(model_factory: ModelFactory, task: _Task, highest_position: int):
  model = model_factory(task.scheme, task.dtype)
  if model.position_scheme != task.scheme:
    raise ValueError(f'factory gave a {model.position_scheme!r} model for {task.scheme!r}')
  positions_lib.check_table_size(model.tables, highest_position)
  return model


def _offset_figures(model, block, cont, offset: int, fresh0, layout) -> dict[str, dict]:
  """`figures` of every arm at `offset` against fresh(offset); fresh0 is fresh(0) [T, V]."""
  fresh = fresh0 if offset == 0 else relocation.fresh_at(model, block, cont, offset, layout)
  arms = {
    'relocated': relocation.relocated_to(model, block, cont, offset, layout),
    'control': fresh0,
    'own_position': relocation.own_position(model, block, cont, offset, layout),
  }
  return {arm: figures(fresh, logits) for arm, logits in arms.items()}


def _composition_figures(model, block, cont, pair, layout) -> dict[str, Any]:
  """`figures` of the two half-blocks grafted at `pair` vs fresh block attention."""
  a, b = block[: len(block) // 2], block[len(block) // 2 :]
  return figures(
    relocation.composed_fresh(model, a, b, cont, pair, layout),
    relocation.composed_grafted(model, a, b, cont, pair, layout),
  )


def run_sweep(
  *,
  model_factory: ModelFactory,
  schemes: Sequence[str],
  dtypes: Sequence[str],
  offsets: Sequence[int],
  samples: Sequence[corpus.TextSample],
  layout: relocation.Layout,
  composition_offsets: Sequence[tuple[int, int]] = (),
  progress: Progress | None = None,
) -> dict[str, Any]:
  """Runs every arm for every scheme, dtype, offset and sample.

  Args:
    model_factory: (scheme, dtype name) -> Gemma; called once per pair.
    schemes: registered position scheme names (`schemes.names()`).
    dtypes: 'float32' and/or 'bfloat16'.
    offsets: positions M of the block's first token.
    samples: blocks (`prefix_ids`, n tokens) and continuations, all of one length.
    layout: capacity and chunk size shared by every arm (`layout_for`).
    composition_offsets: (offset of A, offset of B) pairs; A is the block's
      first n // 2 tokens, B the rest.
    progress: wraps the list of work items (e.g. in a tqdm bar).

  Returns:
    JSON-ready dict: 'cells' (one per scheme, dtype, offset, with a
    `summarize` dict per arm), 'composition' (one per scheme, dtype, pair),
    'models' (fingerprints), 'samples' (token digests) and the settings.

  Raises:
    ValueError: if lengths, layout, offsets or position tables do not fit.
  """
  pairs = [tuple(int(x) for x in p) for p in composition_offsets]
  _check(samples, layout, offsets, pairs)
  n, c = len(samples[0].prefix_ids), len(samples[0].continuation_ids)
  highest = max(list(offsets) + [b for _, b in pairs]) + n + c
  tasks = _tasks(schemes, dtypes, offsets, pairs, len(samples))
  found: dict[tuple, list[dict[str, Any]]] = {}
  models, model, key, fresh0 = [], None, None, {}
  for task in (progress or (lambda it: it))(tasks):
    if (task.scheme, task.dtype) != key:
      key, fresh0 = (task.scheme, task.dtype), {}
      model = _model(model_factory, task, highest)
      models.append(
        {
          'scheme': task.scheme,
          'dtype': task.dtype,
          'fingerprint': model.fingerprint,
          'params_sha256': model.params_digest,
        }
      )
    block = list(samples[task.sample].prefix_ids)
    cont = list(samples[task.sample].continuation_ids)
    if task.pair is not None:
      found.setdefault(key + (task.pair,), []).append(
        _composition_figures(model, block, cont, task.pair, layout)
      )
      continue
    if task.sample not in fresh0:
      fresh0[task.sample] = relocation.fresh_at(model, block, cont, 0, layout)
    arms = _offset_figures(model, block, cont, task.offset, fresh0[task.sample], layout)
    for arm, f in arms.items():
      found.setdefault(key + (task.offset, arm), []).append(f)

  return {
    'schemes': list(schemes),
    'dtypes': list(dtypes),
    'offsets': [int(m) for m in offsets],
    'composition_offsets': [list(p) for p in pairs],
    'block_tokens': n,
    'continuation_tokens': c,
    'layout': dataclasses.asdict(layout),
    'samples': [
      {
        'source': s.source,
        'block_sha256': ledger.sha256_tokens(s.prefix_ids),
        'continuation_sha256': ledger.sha256_tokens(s.continuation_ids),
      }
      for s in samples
    ],
    'models': models,
    'cells': [
      {
        'scheme': s,
        'dtype': d,
        'offset': int(m),
        **{arm: summarize(found[(s, d, m, arm)]) for arm in ARMS},
      }
      for d in dtypes
      for s in schemes
      for m in offsets
    ],
    'composition': [
      {'scheme': s, 'dtype': d, 'offsets': list(p), 'split': n // 2, **summarize(found[(s, d, p)])}
      for d in dtypes
      for s in schemes
      for p in pairs
    ],
  }


def cell(result: dict[str, Any], *, scheme: str, dtype: str, offset: int) -> dict[str, Any]:
  """The cell of `result` for one scheme, dtype and offset.

  Raises:
    KeyError: if the sweep did not run it.
  """
  for c in result['cells']:
    if (c['scheme'], c['dtype'], c['offset']) == (scheme, dtype, offset):
      return c
  raise KeyError(f'no cell for {scheme} {dtype} offset {offset}')


NAMED_MODELS = ('gemma3-270m', 'tiny')


def committed(root: str | os.PathLike, pattern: str = 'relocation_*.json') -> list[pathlib.Path]:
  """Committed result files under `root`/COMMITTED_RESULTS matching `pattern`, sorted.

  The default pattern names the relocation sweeps of experiments/relocation.py
  (the real model's and each trained model's).
  """
  return sorted((pathlib.Path(root) / COMMITTED_RESULTS).rglob(pattern))


def parse_pairs(values: list[str]) -> list[tuple[int, int]]:
  """['64:4096', ...] -> [(64, 4096), ...]."""
  pairs = []
  for value in values:
    a, sep, b = value.partition(':')
    if not sep:
      raise ValueError(f'composition offsets must look like A:B, got {value!r}')
    pairs.append((int(a), int(b)))
  return pairs


def model_source(model: str) -> tuple[Callable[[str], gemma_model.Gemma], dict]:
  """(dtype name -> Gemma, what to record about the model's origin)."""
  if model in NAMED_MODELS:
    load = lambda dtype: gemma_model.load_named(model, dtype=jnp.dtype(dtype))
    info = {'gguf_sha256': gguf_lib.expected_sha256()} if model != 'tiny' else {}
    return load, info
  if not os.path.isdir(model):
    raise ValueError(f'--model={model!r} is neither {NAMED_MODELS} nor a checkpoint folder')
  if not (pathlib.Path(model) / training.MODEL_JSON).is_file():  # a checkpoint of one's own
    load = lambda dtype: gemma_model.load_named(model, dtype=jnp.dtype(dtype))
    return load, {'checkpoint': model}
  record = training.load_record(model)
  info = {
    'checkpoint': model,
    'training': {
      k: record[k]
      for k in (
        'result_sha256',
        'command',
        'size',
        'parameter_count',
        'held_out_loss',
        'held_out_bits_per_byte',
        'held_out_tokens',
        'params_sha256',
        'model_fingerprint',
      )
      if k in record
    },
  }
  info['training']['scheme'] = record['config']['position_scheme']
  info['training']['steps'] = record['settings']['steps']
  return lambda dtype: training.load_trained(model, dtype=jnp.dtype(dtype)), info


def experiment(
  *,
  model: str,
  schemes: list[str] | None,
  dtypes: list[str],
  offsets: list[int],
  samples: int,
  block_tokens: int,
  continuation_tokens: int,
  chunk_size: int,
  composition_offsets: list[tuple[int, int]],
  command: str | None = None,
) -> dict:
  """experiments/relocation.py: builds the samples and the model factory, runs the sweep;
  the result with its header."""
  load, info = model_source(model)
  base = functools.cache(load)
  if schemes is None:
    schemes = [info['training']['scheme']] if 'training' in info else list(schemes_lib.names())
  # A model trained here reads the bytes it was trained on (`training`).
  trained = 'training' in info
  tokenizer = corpus.ByteTokenizer(training.VOCAB_SIZE) if trained else base(dtypes[0]).tokenizer
  text = corpus.text_samples(
    tokenizer, count=samples, prefix_tokens=block_tokens, continuation_tokens=continuation_tokens
  )
  result = run_sweep(
    model_factory=lambda scheme, dtype: base(dtype).with_position_scheme(scheme),
    schemes=schemes,
    dtypes=dtypes,
    offsets=offsets,
    samples=text,
    layout=layout_for(
      block_tokens=block_tokens, continuation_tokens=continuation_tokens, chunk_size=chunk_size
    ),
    composition_offsets=composition_offsets,
    progress=lambda it: tqdm.tqdm(it, desc='relocation', unit='item'),
  )
  inputs = {**results.model_inputs(base(dtypes[0]), model), **info}
  head = results.header('relocation', inputs=inputs, command=command)
  return {
    **head,
    'model': os.path.basename(os.path.normpath(model)),
    'device': head['determinism']['device_kind'],
    **result,
  }


def format_table(result: dict) -> str:
  """Byte-equal counts and worst KL per scheme, dtype and offset."""
  lines = [
    f'{result["model"]} on {result["device"]}:',
    '  scheme dtype offset | relocated eq  KL max  max|Δ|  flips | control eq  KL max | own eq',
  ]
  for c in result['cells']:
    r, f, o = c['relocated'], c['control'], c['own_position']
    lines.append(
      f'  {c["scheme"]:13s} {c["dtype"]:8s} {c["offset"]:6d} | {r["byte_equal"]}/{r["samples"]}'
      f'  {r["kl_max"]:.3g}  {r["max_abs_diff"]:.3g}  {r["argmax_flips"]} |'
      f' {f["byte_equal"]}/{f["samples"]}  {f["kl_max"]:.3g} | {o["byte_equal"]}/{o["samples"]}'
    )
  for c in result['composition']:
    lines.append(
      f'  composition {c["scheme"]} {c["dtype"]} at {c["offsets"]}:'
      f' {c["byte_equal"]}/{c["samples"]} byte-equal, KL max {c["kl_max"]:.3g},'
      f' max|Δ| {c["max_abs_diff"]:.3g}'
    )
  return '\n'.join(lines)
