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

import pathlib
import sys

import numpy as np
import parity_cases

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / 'tests' / 'fixtures' / 'gemma4_parity'
SEED = 20_260_401
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


def export(out: pathlib.Path) -> None:
  """Step 1 (project venv): each case's random weights as a safetensors folder."""
  parity_cases.export(CASES, case_config, out, seed=SEED)


def reference(out: pathlib.Path) -> None:
  """Step 2 (torch + transformers): logits and greedy ids of each case, written as fixtures."""
  import torch
  import transformers

  torch.set_grad_enabled(False)
  versions = {'transformers': transformers.__version__, 'torch': torch.__version__}
  for name in CASES:
    folder = out / name
    tokens = torch.from_numpy(parity_cases.exported_tokens(folder))
    hf = transformers.Gemma4ForCausalLM.from_pretrained(
      folder, dtype=torch.float32, attn_implementation='eager'
    ).eval()
    logits = hf(tokens[None], use_cache=False).logits[0].numpy()
    greedy = hf.generate(
      tokens[None, :GREEDY_PREFIX],
      max_new_tokens=GREEDY_STEPS,
      do_sample=False,
      min_new_tokens=GREEDY_STEPS,
    )[0, GREEDY_PREFIX:]
    recorded = parity_cases.record(name, folder, logits, seed=SEED, versions=versions)
    recorded['greedy_prefix'] = GREEDY_PREFIX
    recorded['greedy_ids'] = greedy.numpy().astype(np.int32).tolist()
    parity_cases.write(FIXTURES, name, recorded)
    del hf, logits


if __name__ == '__main__':
  parity_cases.main(sys.argv, export, reference)
