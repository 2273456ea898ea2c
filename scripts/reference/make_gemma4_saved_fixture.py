"""Fixtures: Gemma 4 folders written by transformers' own `save_pretrained`, with its logits.

transformers 5.25 writes a Gemma 4 config.json with `per_layer_config` (each global layer's
`head_dim` and, where it differs, `num_key_value_heads`) in place of `global_head_dim` /
`num_global_key_value_heads`. For each size's structure at reduced width (E2B: kv sharing,
per-layer inputs, the double-wide MLP; E4B; 31B: K=V global layers with their own kv heads;
26B-A4B: the same with a mixture of experts; the structure of transformers' own
`Gemma4TextConfig()` defaults, whose multimodal `Gemma4Config()` it writes whole as
tests/fixtures/gemma4_transformers_defaults.json) this script builds a `Gemma4ForCausalLM`
from a `Gemma4TextConfig` and saves it with `save_pretrained` under tests/fixtures/gemma4_saved/<case>/
(config.json, generation_config.json, model.safetensors). It then replaces model.safetensors by
the seeded weights of `seeded_weights` for the same header (scales that make the logits O(1);
transformers' own init gives logits too small to tell models apart), loads the folder with
`from_pretrained` as a user would (no key missing, unexpected or of another shape; every
loaded tensor equal to the file's), records its float32 eager logits as <case>.json
(`parity_cases.record`) with whether they are bit-identical under
`use_bidirectional_attention='vision'` (`meta.vision_logits_equal`), writes the header, seed
and file digest as <case>/weights_header.json, and deletes the weights: no weights are
committed. `tests/models/gemma/test_hf_config_saved.py` rebuilds each folder with
`seeded_weights.rebuild`, checks the digest, loads it with `model.load` and compares; it needs
no torch.

The global head width (32) differs from the sliding one (16) and from the 512 a reader
assumes when it misses `per_layer_config`. Run from the repository root in an environment
with torch (CPU), transformers 5.25 and numpy (~1 min on 2 cores):

    REFENV/bin/python scripts/reference/make_gemma4_saved_fixture.py reference tests/fixtures/gemma4_saved
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import parity_cases
import seeded_weights

SEED = 20_261_207
TOKENS = 40

_COMMON = dict(
  hidden_size=32,
  intermediate_size=64,
  vocab_size=128,
  vocab_size_per_layer_input=128,
  head_dim=16,
  global_head_dim=32,
  sliding_window=8,
  final_logit_softcapping=30.0,
  hidden_size_per_layer_input=0,
)


def _types(num_layers: int, local_per_global: int) -> list[str]:
  period = local_per_global + 1
  return [
    'full_attention' if (i + 1) % period == 0 or i == num_layers - 1 else 'sliding_attention'
    for i in range(num_layers)
  ]


# name -> Gemma4TextConfig keywords: each published size's structure, narrower.
CASES = {
  'e2b_like': dict(
    _COMMON,
    num_hidden_layers=10,
    layer_types=_types(10, 4),
    num_attention_heads=4,
    num_key_value_heads=1,
    num_kv_shared_layers=4,
    use_double_wide_mlp=True,
    hidden_size_per_layer_input=8,
  ),
  'e4b_like': dict(
    _COMMON,
    num_hidden_layers=12,
    layer_types=_types(12, 5),
    num_attention_heads=4,
    num_key_value_heads=2,
    num_kv_shared_layers=4,
    hidden_size_per_layer_input=8,
  ),
  '31b_like': dict(
    _COMMON,
    num_hidden_layers=6,
    layer_types=_types(6, 5),
    num_attention_heads=4,
    num_key_value_heads=2,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
  ),
  '26b_a4b_like': dict(
    _COMMON,
    num_hidden_layers=6,
    layer_types=_types(6, 5),
    num_attention_heads=4,
    num_key_value_heads=2,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    intermediate_size=24,
    enable_moe_block=True,
    num_experts=8,
    top_k_experts=2,
    moe_intermediate_size=16,
  ),
  # transformers' own `Gemma4TextConfig()` defaults (recorded whole in DEFAULTS): per-layer
  # inputs without kv sharing, no final soft-capping, 2 query heads per kv head everywhere.
  'defaults_like': dict(
    _COMMON,
    num_hidden_layers=6,
    layer_types=_types(6, 5),
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size_per_layer_input=8,
    final_logit_softcapping=None,
  ),
}
DEFAULTS = 'gemma4_transformers_defaults.json'


def _check_loaded(hf, loading: dict, folder: pathlib.Path) -> None:
  """Every tensor of the file is loaded as written, and nothing is missing or left over."""
  import safetensors.torch
  import torch

  problems = {k: v for k, v in loading.items() if v}
  assert not problems, f'{folder}: {problems}'
  state = hf.state_dict()
  for name, tensor in safetensors.torch.load_file(folder / seeded_weights.WEIGHTS_FILE).items():
    assert torch.equal(state[name], tensor), f'{folder}: {name} is not the seeded tensor'


def reference(out: pathlib.Path) -> None:
  """Saves each case with `save_pretrained` under `out`, with seeded weights, and records
  its logits there; the weights are deleted, their header kept."""
  import torch
  import transformers

  torch.set_grad_enabled(False)
  versions = {
    'transformers': transformers.__version__,
    'torch': torch.__version__,
    'numpy': np.__version__,
  }
  # The multimodal config transformers makes with no arguments, every field written.
  (out.parent / DEFAULTS).write_text(transformers.Gemma4Config().to_json_string(use_diff=False))
  for name, keywords in CASES.items():
    config = transformers.Gemma4TextConfig(**keywords)
    config._attn_implementation = 'eager'
    folder = out / name
    transformers.Gemma4ForCausalLM(config).save_pretrained(folder)
    weights = folder / seeded_weights.WEIGHTS_FILE
    tensors = seeded_weights.header_of(weights)
    sha256 = seeded_weights.write(weights, tensors, SEED)
    tokens = parity_cases.case_tokens(TOKENS, config.vocab_size, SEED)
    # From the saved folder, as a user would load it.
    saved, loading = transformers.Gemma4ForCausalLM.from_pretrained(
      folder, dtype=torch.float32, attn_implementation='eager', output_loading_info=True
    )
    _check_loaded(saved.eval(), loading, folder)
    ids = torch.from_numpy(tokens.astype(np.int64))[None]
    logits = saved(ids, use_cache=False).logits[0]
    # Every published Gemma 4 sets use_bidirectional_attention='vision': text-only logits
    # are the very same bits without it.
    vision = transformers.Gemma4ForCausalLM.from_pretrained(
      folder, dtype=torch.float32, attn_implementation='eager', use_bidirectional_attention='vision'
    ).eval()
    assert vision.config.use_bidirectional_attention == 'vision'
    vision_equal = bool(torch.equal(vision(ids, use_cache=False).logits[0], logits))
    case = folder / 'case.json'
    case.write_text(json.dumps({'tokens': tokens.tolist(), 'params_digest': None}))
    recorded = parity_cases.record(name, folder, logits.numpy(), seed=SEED, versions=versions)
    case.unlink()
    recorded['meta']['vision_logits_equal'] = vision_equal
    recorded['meta']['weights_sha256'] = sha256
    parity_cases.write(out, name, recorded)
    seeded_weights.record(folder, tensors, SEED, sha256)
    weights.unlink()


if __name__ == '__main__':
  parity_cases.main(sys.argv, lambda out: None, reference)
