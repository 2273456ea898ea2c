"""Parity fixtures: transformers' Gemma3ForCausalLM on our seeded random weights.

For each case (a Gemma 3 size's structure at reduced width, and the full 1B
config) our `model.random(config, seed)` weights are exported as a float32
safetensors checkpoint; transformers loads that folder with its own
`from_pretrained` (config.json included: rope scaling, query_pre_attn_scalar,
window, layer types), runs the case's tokens in float32 with eager
attention on the CPU, and the fixture keeps, at a few hundred positions,
the logits at a fixed vocabulary subset, the top-20 ids and values and the
argmax, beside the config and seed that regenerate the weights.
`tests/models/gemma/test_gemma3_parity.py` reads them; it needs no torch.

Two steps, from the repository root:

    .venv/bin/python scripts/reference/make_gemma3_parity_fixture.py export /tmp/gemma3_parity
    REFENV/bin/python scripts/reference/make_gemma3_parity_fixture.py reference \\
        /tmp/gemma3_parity

The reference environment needs torch (CPU) and transformers only:
`python -m venv REFENV && REFENV/bin/pip install torch transformers safetensors numpy`.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / 'tests' / 'fixtures' / 'gemma3_parity'
SEED = 20_260_101
TOP_K = 20
NUM_POSITIONS = 256
VOCAB_SUBSET = 16

# name -> (named config, overrides, tokens). Reduced cases keep the size's kv
# heads, head_dim, query_pre_attn_scalar, window and rope scaling, and run
# past the window; the full 1B case runs the published config as it is.
_REDUCED = {'embed_dim': 64, 'hidden_dim': 128, 'vocab_size': 1024}
CASES = {
  '1b_reduced': ('gemma3-1b', {**_REDUCED, 'num_layers': 6}, 640),
  '4b_reduced': ('gemma3-4b', {**_REDUCED, 'num_layers': 6}, 1100),
  '12b_reduced': ('gemma3-12b', {**_REDUCED, 'num_layers': 6}, 1100),
  '27b_reduced': ('gemma3-27b', {**_REDUCED, 'num_layers': 6}, 1100),
  '1b_full': ('gemma3-1b', {}, 256),
}


def case_config(name: str):
  """The GemmaConfig of a case (the project's own code)."""
  from graftjax.models.gemma import config as config_lib

  base, overrides, _ = CASES[name]
  overrides = dict(overrides)
  layers = overrides.pop('num_layers', None)
  if layers is not None:
    overrides['attention_types'] = config_lib.gemma3_attention_pattern(layers)
  return config_lib.get_config(base, **overrides)


def case_tokens(name: str, vocab_size: int) -> np.ndarray:
  _, _, length = CASES[name]
  rng = np.random.default_rng(SEED + length)
  ids = rng.integers(3, vocab_size, size=length, dtype=np.int32)
  ids[0] = 2  # BOS
  return ids


def case_positions(length: int) -> np.ndarray:
  return np.unique(np.linspace(0, length - 1, min(NUM_POSITIONS, length)).round().astype(np.int32))


def export(out: pathlib.Path) -> None:
  """Step 1 (project venv): each case's random weights as a safetensors folder."""
  from graftjax.models.gemma import model
  from graftjax.models.gemma import safetensors_io

  for name in CASES:
    config = case_config(name)
    m = model.random(config, seed=SEED)
    folder = safetensors_io.save(m.params, config, out / name, max_shard_bytes=1 << 30)
    tokens = case_tokens(name, config.vocab_size)
    (folder / 'case.json').write_text(
      json.dumps({'tokens': tokens.tolist(), 'params_digest': m.params_digest})
    )
    print(name, folder, flush=True)
    del m


def reference(out: pathlib.Path) -> None:
  """Step 2 (torch + transformers): logits of each case, written as fixtures."""
  import torch
  import transformers

  FIXTURES.mkdir(parents=True, exist_ok=True)
  torch.set_grad_enabled(False)
  for name in CASES:
    folder = out / name
    case = json.loads((folder / 'case.json').read_text())
    tokens = np.asarray(case['tokens'], np.int64)
    hf = transformers.Gemma3ForCausalLM.from_pretrained(
      folder, torch_dtype=torch.float32, attn_implementation='eager'
    ).eval()
    logits = hf(torch.from_numpy(tokens)[None]).logits[0].numpy().astype(np.float32)
    positions = case_positions(len(tokens))
    rng = np.random.default_rng(SEED)
    subset = np.sort(rng.choice(logits.shape[-1], VOCAB_SUBSET, replace=False)).astype(np.int32)
    picked = logits[positions]
    top = np.argsort(-picked, axis=-1, kind='stable')[:, :TOP_K].astype(np.int32)
    meta = {
      'case': name,
      'seed': SEED,
      'params_digest': case['params_digest'],
      'config_json': json.loads((folder / 'config.json').read_text()),
      'transformers': transformers.__version__,
      'torch': torch.__version__,
      'dtype': 'float32',
      'attention': 'eager',
    }
    # Reference outputs only (no weights): float32 values as JSON numbers read back exactly.
    recorded = {
      'meta': meta,
      'tokens': tokens.astype(np.int32).tolist(),
      'positions': positions.tolist(),
      'subset_ids': subset.tolist(),
      'subset_logits': picked[:, subset].tolist(),
      'top_ids': top.tolist(),
      'top_logits': np.take_along_axis(picked, top, axis=-1).tolist(),
      'argmax': np.argmax(picked, axis=-1).astype(np.int32).tolist(),
    }
    (FIXTURES / f'{name}.json').write_text(
      json.dumps(recorded, sort_keys=True, separators=(',', ':')) + '\n'
    )
    print(name, 'positions', len(positions), flush=True)
    del hf, logits


def main(argv: list[str]) -> None:
  if len(argv) != 3 or argv[1] not in ('export', 'reference'):
    raise SystemExit(f'usage: {argv[0]} export|reference FOLDER')
  step = export if argv[1] == 'export' else reference
  step(pathlib.Path(argv[2]))


if __name__ == '__main__':
  main(sys.argv)
