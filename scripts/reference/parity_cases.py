"""The steps both parity fixture scripts share: a case's tokens and positions, the export of
our seeded random weights, and the fixture written from the reference's logits.

A case is (named config, overrides, token count); each script maps names to cases and says
how overrides become a config (`case_config`).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np

TOP_K = 20
NUM_POSITIONS = 256
VOCAB_SUBSET = 16


def case_tokens(length: int, vocab_size: int, seed: int) -> np.ndarray:
  """BOS, then `length - 1` ids drawn from [3, vocab_size) by `seed + length`: [length] int32."""
  rng = np.random.default_rng(seed + length)
  ids = rng.integers(3, vocab_size, size=length, dtype=np.int32)
  ids[0] = 2  # BOS
  return ids


def case_positions(length: int) -> np.ndarray:
  """Up to `NUM_POSITIONS` positions spread evenly over [0, length), sorted: [P] int32."""
  return np.unique(np.linspace(0, length - 1, min(NUM_POSITIONS, length)).round().astype(np.int32))


def export(
  cases: dict[str, tuple],
  case_config: Callable[[str], Any],
  out: pathlib.Path,
  *,
  seed: int,
  **save: Any,
) -> None:
  """Step 1 (project venv): each case's random weights as a safetensors folder under `out`,
  with case.json (its tokens and the weights' digest); `save` goes to `safetensors_io.save`."""
  from graftjax.models.gemma import model
  from graftjax.models.gemma import safetensors_io

  for name, (_, _, length) in cases.items():
    config = case_config(name)
    m = model.random(config, seed=seed)
    folder = safetensors_io.save(m.params, config, out / name, **save)
    tokens = case_tokens(length, config.vocab_size, seed)
    (folder / 'case.json').write_text(
      json.dumps({'tokens': tokens.tolist(), 'params_digest': m.params_digest})
    )
    print(name, folder, flush=True)
    del m


def exported_tokens(folder: pathlib.Path) -> np.ndarray:
  """The tokens `export` wrote for the case in `folder`: [T] int64, as torch wants them."""
  return np.asarray(json.loads((folder / 'case.json').read_text())['tokens'], np.int64)


def record(
  name: str, folder: pathlib.Path, logits: np.ndarray, *, seed: int, versions: dict[str, str]
) -> dict[str, Any]:
  """The fixture of case `name` (exported in `folder`) from the reference's float32 logits
  [T, V] at every token: at `case_positions`, the logits of a vocabulary subset drawn by
  `seed`, the top `TOP_K` ids and values, the argmax; `versions` names the reference's
  libraries. No weights: float32 values as JSON numbers read back exactly."""
  case = json.loads((folder / 'case.json').read_text())
  tokens = np.asarray(case['tokens'], np.int32)
  positions = case_positions(len(tokens))
  rng = np.random.default_rng(seed)
  subset = np.sort(rng.choice(logits.shape[-1], VOCAB_SUBSET, replace=False)).astype(np.int32)
  picked = np.asarray(logits, np.float32)[positions]
  top = np.argsort(-picked, axis=-1, kind='stable')[:, :TOP_K].astype(np.int32)
  meta = {
    'case': name,
    'seed': seed,
    'params_digest': case['params_digest'],
    'config_json': json.loads((folder / 'config.json').read_text()),
    **versions,
    'dtype': 'float32',
    'attention': 'eager',
  }
  return {
    'meta': meta,
    'tokens': tokens.tolist(),
    'positions': positions.tolist(),
    'subset_ids': subset.tolist(),
    'subset_logits': picked[:, subset].tolist(),
    'top_ids': top.tolist(),
    'top_logits': np.take_along_axis(picked, top, axis=-1).tolist(),
    'argmax': np.argmax(picked, axis=-1).astype(np.int32).tolist(),
  }


def write(fixtures: pathlib.Path, name: str, recorded: dict[str, Any]) -> None:
  """`recorded` as `fixtures/<name>.json`, compact with sorted keys."""
  fixtures.mkdir(parents=True, exist_ok=True)
  (fixtures / f'{name}.json').write_text(
    json.dumps(recorded, sort_keys=True, separators=(',', ':')) + '\n'
  )
  print(name, 'positions', len(recorded['positions']), flush=True)


def main(argv: list[str], export_step: Callable, reference_step: Callable) -> None:
  if len(argv) != 3 or argv[1] not in ('export', 'reference'):
    raise SystemExit(f'usage: {argv[0]} export|reference FOLDER')
  step = export_step if argv[1] == 'export' else reference_step
  step(pathlib.Path(argv[2]))
