"""Model FLOPs of a prefill, counted from the config, and the utilization they give.

    flops = 2 * (matmul parameters a token passes) * tokens      projections, MLP, active
                                                                  experts, per-layer inputs
          + 4 * N * H_l * (keys each query sees), every layer     QK^T and PV
          + 2 * D * V * (tokens whose logits are computed)        the tied output head

As the usual model-FLOP utilization counts them: a mixture of experts counts its top-k
experts only (this implementation runs every expert and weights the others 0, so it does
E / k times their work), norms, rotary and softmax count nothing, and a kv-shared layer
counts no key or value projection.
"""

from __future__ import annotations

import numpy as np

from graftjax.models.gemma import config as config_lib

# Dense bfloat16 peak FLOP/s (no sparsity) by device kind, lower-case prefix: NVIDIA's
# H100 SXM and H200 data sheets (989.4 TFLOP/s each).
BF16_DENSE_PEAK = {'nvidia h100': 989.4e12, 'nvidia h200': 989.4e12}


def matmul_params_per_token(config: config_lib.GemmaConfig) -> int:
  """Weights one token's prefill multiplies by (the output head aside)."""
  d, n = config.embed_dim, config.num_heads
  total = 0
  cached = set(config.cached_layers)
  for layer in range(config.num_layers):
    h, k = config.head_dim_of(layer), config.kv_heads_of(layer)
    total += 2 * d * n * h  # q and o
    if layer in cached:
      total += d * k * h * (1 if config.k_eq_v(layer) else 2)  # k (and v)
    total += 3 * d * config.mlp_dim(layer)  # gate, up, down
    if config.is_moe:
      total += d * config.num_experts + config.top_k_experts * 3 * d * config.expert_dim
    total += 2 * d * config.per_layer_input_dim  # pl_gate, pl_proj
  return total + d * config.num_layers * config.per_layer_input_dim  # per_layer_projection


def keys_seen(config: config_lib.GemmaConfig, layer: int, tokens: int, start: int = 0) -> int:
  """Keys the queries at positions [start, start + tokens) see in `layer`, summed."""
  seen = np.arange(start, start + tokens, dtype=np.int64) + 1
  window = config.window(layer)
  return int(np.minimum(seen, window).sum() if window else seen.sum())


def prefill_flops(
  config: config_lib.GemmaConfig, tokens: int, *, start: int = 0, logits_tokens: int = 0
) -> int:
  """Model FLOPs of prefilling `tokens` tokens at positions [start, start + tokens), with
  logits for `logits_tokens` of them."""
  attention = sum(
    4 * config.num_heads * config.head_dim_of(layer) * keys_seen(config, layer, tokens, start)
    for layer in range(config.num_layers)
  )
  head = 2 * config.embed_dim * config.vocab_size * logits_tokens
  return 2 * matmul_params_per_token(config) * tokens + attention + head


def peak_flops(device_kind: str, platform: str) -> tuple[float | None, str | None]:
  """(dense bfloat16 peak FLOP/s of the device, None) or (None, why there is none)."""
  if platform == 'cpu':
    return None, 'CPU: no dense bfloat16 peak to set a utilization against'
  kind = device_kind.lower()
  for prefix, peak in BF16_DENSE_PEAK.items():
    if kind.startswith(prefix):
      return peak, None
  return None, f'no dense bfloat16 peak recorded for {device_kind!r} (prefill_flops.py)'
