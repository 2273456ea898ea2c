"""Params from the GGUF, converted once and cached as an orbax checkpoint.

The first load dequantizes the GGUF to float32 and saves the params pytree
with orbax under `~/.cache/graftjax/params/<gguf sha256>/` (override the
root with $GRAFTJAX_CACHE). Later loads restore from there. A digest of
the params' bytes is saved beside the checkpoint and checked on restore,
so a damaged cache is an error, never silently different weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import tempfile

import jax
import numpy as np

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import gguf as gguf_lib

CONVERSION_VERSION = 1  # bump when the GGUF -> params mapping changes
_DIGEST_FILE = 'params_digest.json'


def config_from_gguf(metadata: dict) -> config_lib.GemmaConfig:
  """A GemmaConfig read from GGUF metadata (architecture 'gemma3')."""
  arch = metadata.get('general.architecture')
  if arch != 'gemma3':
    raise gguf_lib.GGUFError(f"expected a 'gemma3' GGUF, got architecture {arch!r}")
  get = lambda key: metadata[f'gemma3.{key}']
  head_dim = int(get('attention.key_length'))
  return config_lib.GemmaConfig(
    vocab_size=len(metadata['tokenizer.ggml.tokens']),
    embed_dim=int(get('embedding_length')),
    hidden_dim=int(get('feed_forward_length')),
    num_heads=int(get('attention.head_count')),
    num_kv_heads=int(get('attention.head_count_kv')),
    head_dim=head_dim,
    attention_types=config_lib.gemma3_attention_pattern(int(get('block_count'))),
    sliding_window=int(get('attention.sliding_window')),
    local_rope_theta=10_000.0,  # llama.cpp's fixed base for gemma3 local layers
    global_rope_theta=float(get('rope.freq_base')),
    query_scale=head_dim**-0.5,
    rms_norm_eps=float(np.float32(get('attention.layer_norm_rms_epsilon'))),
    bos_id=int(metadata['tokenizer.ggml.bos_token_id']),
    eos_id=int(metadata['tokenizer.ggml.eos_token_id']),
    pad_id=int(metadata['tokenizer.ggml.padding_token_id']),
    end_of_turn_id=106,
  )


def params_from_gguf(gguf_file: gguf_lib.GGUFFile, config: config_lib.GemmaConfig) -> dict:
  """Dequantized float32 numpy params in the layout of `transformer.py`."""
  read = lambda name: gguf_lib.read_tensor(gguf_file, name)
  d, n, k, h = config.embed_dim, config.num_heads, config.num_kv_heads, config.head_dim
  layer_params = []
  for i in range(config.num_layers):
    blk = lambda name: read(f'blk.{i}.{name}.weight')
    layer_params.append(
      {
        'attn_norm': blk('attn_norm'),
        'post_attn_norm': blk('post_attention_norm'),
        'ffn_norm': blk('ffn_norm'),
        'post_ffn_norm': blk('post_ffw_norm'),
        # GGUF matrices are [out, in]; heads are the slow part of `out`.
        'q': blk('attn_q').reshape(n, h, d).transpose(2, 0, 1),
        'k': blk('attn_k').reshape(k, h, d).transpose(2, 0, 1),
        'v': blk('attn_v').reshape(k, h, d).transpose(2, 0, 1),
        'o': blk('attn_output').reshape(d, n, h).transpose(1, 2, 0),
        'q_norm': blk('attn_q_norm'),
        'k_norm': blk('attn_k_norm'),
        'gate': blk('ffn_gate').T,
        'up': blk('ffn_up').T,
        'down': blk('ffn_down').T,
      }
    )
  params = {
    'embedding': read('token_embd.weight'),
    'final_norm': read('output_norm.weight'),
    'layers': tuple(layer_params),
  }
  return jax.tree.map(np.ascontiguousarray, params)


def params_digest(params) -> str:
  """SHA-256 over every leaf's path, dtype, shape and bytes (host order)."""
  digest = hashlib.sha256()
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  for path, leaf in leaves:
    arr = np.ascontiguousarray(np.asarray(leaf))
    digest.update(jax.tree_util.keystr(path).encode())
    digest.update(f'{arr.dtype.str}{arr.shape}'.encode())
    digest.update(arr.reshape(-1).view(np.uint8))  # the bytes, not a copy
  return digest.hexdigest()


def cache_root() -> pathlib.Path:
  root = os.environ.get('GRAFTJAX_CACHE')
  return pathlib.Path(root) if root else pathlib.Path.home() / '.cache' / 'graftjax'


def _as_layer_tuple(params: dict) -> dict:
  layers = params['layers']
  if isinstance(layers, dict):  # orbax may restore a sequence as {'0': ..., }
    layers = [layers[str(i)] for i in range(len(layers))]
  return {**params, 'layers': tuple(layers)}


def load_params(gguf_path: str | os.PathLike, gguf_sha256: str) -> tuple[dict, str]:
  """float32 numpy params of the GGUF and their digest, through the orbax cache.

  Args:
    gguf_path: the GGUF file.
    gguf_sha256: its SHA-256 (names the cache entry).
  Returns:
    (params with numpy leaves, params_digest(params)).
  """
  import orbax.checkpoint as ocp

  entry = cache_root() / 'params' / f'{gguf_sha256}-v{CONVERSION_VERSION}'
  digest_path = entry / _DIGEST_FILE
  if digest_path.exists():
    expected = json.loads(digest_path.read_text())['params_sha256']
    restored = ocp.PyTreeCheckpointer().restore(entry / 'params')
    params = _as_layer_tuple(jax.tree.map(np.asarray, restored))
    found = params_digest(params)
    if found != expected:
      raise RuntimeError(
        f'params cache {entry} is damaged: digest {found} != {expected};'
        ' delete the folder to convert again'
      )
    return params, found

  gguf_file = gguf_lib.open_gguf(gguf_path)
  params = params_from_gguf(gguf_file, config_from_gguf(gguf_file.metadata))
  digest = params_digest(params)
  entry.parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(dir=entry.parent, prefix='.tmp-'))
  try:
    ocp.PyTreeCheckpointer().save(staging / 'params', params)
    (staging / _DIGEST_FILE).write_text(json.dumps({'params_sha256': digest}))
    try:
      os.rename(staging, entry)
    except OSError:  # another process converted it first
      pass
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return params, digest
