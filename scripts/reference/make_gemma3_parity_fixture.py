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

import pathlib
import sys

import parity_cases

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / 'tests' / 'fixtures' / 'gemma3_parity'
SEED = 20_260_101

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


def export(out: pathlib.Path) -> None:
  """Step 1 (project venv): each case's random weights as a safetensors folder."""
  parity_cases.export(CASES, case_config, out, seed=SEED, max_shard_bytes=1 << 30)


def reference(out: pathlib.Path) -> None:
  """Step 2 (torch + transformers): logits of each case, written as fixtures."""
  import torch
  import transformers

  torch.set_grad_enabled(False)
  versions = {'transformers': transformers.__version__, 'torch': torch.__version__}
  for name in CASES:
    folder = out / name
    tokens = parity_cases.exported_tokens(folder)
    hf = transformers.Gemma3ForCausalLM.from_pretrained(
      folder, torch_dtype=torch.float32, attn_implementation='eager'
    ).eval()
    logits = hf(torch.from_numpy(tokens)[None]).logits[0].numpy()
    parity_cases.write(
      FIXTURES, name, parity_cases.record(name, folder, logits, seed=SEED, versions=versions)
    )
    del hf, logits


if __name__ == '__main__':
  parity_cases.main(sys.argv, export, reference)
