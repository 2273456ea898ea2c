"""Parity fixtures: transformers' Gemma4ForCausalLM on our seeded random weights.

For each case (a Gemma 4 size's structure at reduced width) our
`model.random(config, seed)` weights are exported as a float32 safetensors
checkpoint (`safetensors_io.save`, a `Gemma4ForCausalLM` config.json);
transformers loads that folder with its own `from_pretrained`, runs the
case's tokens in float32 with eager attention on the CPU, and the fixture
keeps, at a few hundred positions, the logits at a fixed vocabulary subset,
the top-20 ids and values and the argmax, and the greedy continuation of a
prefix (`generate`, transformers' own cache), beside the config and seed that
regenerate the weights. `tests/models/gemma/test_gemma4_parity.py` reads them;
it needs no torch.

Two steps, from the repository root:

    .venv/bin/python scripts/reference/make_gemma4_parity_fixture.py export /tmp/gemma4_parity
    REFENV/bin/python scripts/reference/make_gemma4_parity_fixture.py reference /tmp/gemma4_parity

The reference environment needs torch (CPU) and transformers (5.25 has
`gemma4`), safetensors and numpy.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / 'tests' / 'fixtures' / 'gemma4_parity'
SEED = 20_260_401
TOP_K = 20
NUM_POSITIONS = 256
VOCAB_SUBSET = 16
GREEDY_PREFIX = 48
GREEDY_STEPS = 16

# name -> (named config, overrides, tokens). Reduced cases keep a size's heads, kv heads,
# head sizes (256 sliding, 512 global), partial rotary, K=V, kv sharing (with the
# double-wide MLP), per-layer inputs (narrower), soft-cap and MoE routing (128 experts,
# top 8, narrower), at width 64 over fewer layers, with a window of 128 that the tokens
# run past (the published windows, 512 and 1,024, would cost CI minutes).
_REDUCED = {'embed_dim': 64, 'hidden_dim': 128, 'vocab_size': 1024, 'sliding_window': 128}
CASES = {
  'e2b_reduced': (
    'gemma4-e2b',
    {**_REDUCED, 'layers': (10, 4), 'num_kv_shared_layers': 4, 'per_layer_input_dim': 16},
    320,
  ),
  'e4b_reduced': (
    'gemma4-e4b',
    {**_REDUCED, 'layers': (12, 5), 'num_kv_shared_layers': 4, 'per_layer_input_dim': 16},
    320,
  ),
  '31b_reduced': ('gemma4-31b', {**_REDUCED, 'layers': (6, 5)}, 320),
  '26b_reduced': ('gemma4-26b-a4b', {**_REDUCED, 'layers': (6, 5), 'expert_dim': 32}, 320),
}


def case_config(name: str):
  """The GemmaConfig of a case (the project's own code)."""
  from graftjax.models.gemma import config as config_lib

  base, overrides, _ = CASES[name]
  overrides = dict(overrides)
  num_layers, local_per_global = overrides.pop('layers')
  overrides['attention_types'] = config_lib.attention_pattern(num_layers, local_per_global)
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
    folder = safetensors_io.save(m.params, config, out / name)
    tokens = case_tokens(name, config.vocab_size)
    (folder / 'case.json').write_text(
      json.dumps({'tokens': tokens.tolist(), 'params_digest': m.params_digest})
    )
    print(name, folder, flush=True)


def reference(out: pathlib.Path) -> None:
  """Step 2 (torch + transformers): logits and greedy ids of each case, written as fixtures."""
  import torch
  import transformers

  FIXTURES.mkdir(parents=True, exist_ok=True)
  torch.set_grad_enabled(False)
  for name in CASES:
    folder = out / name
    case = json.loads((folder / 'case.json').read_text())
    tokens = np.asarray(case['tokens'], np.int64)
    hf = transformers.Gemma4ForCausalLM.from_pretrained(
      folder, dtype=torch.float32, attn_implementation='eager'
    ).eval()
    logits = hf(torch.from_numpy(tokens)[None], use_cache=False).logits[0].numpy()
    logits = logits.astype(np.float32)
    prefix = torch.from_numpy(tokens[:GREEDY_PREFIX])[None]
    greedy = hf.generate(
      prefix, max_new_tokens=GREEDY_STEPS, do_sample=False, min_new_tokens=GREEDY_STEPS
    )[0, GREEDY_PREFIX:]
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
      'greedy_prefix': GREEDY_PREFIX,
      'greedy_ids': greedy.numpy().astype(np.int32).tolist(),
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
