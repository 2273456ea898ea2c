"""Gemma 3 and Gemma 4 configurations: frozen dataclasses with named sizes.

`gemma3_270m()` is the real google/gemma-3-270m; `gemma3_1b()` to
`gemma3_27b()` are the text decoders of the larger Gemma 3 models (values of
their published config.json files); `tiny()` is a random-weight model of the
same architecture (local/global pattern, sliding window, multi-query
attention, q/k norm, tied embeddings) small enough for unit tests.

Gemma 4 is the same decoder with more fields set (one code path): global
layers with their own head size and kv heads, keys and values from one
projection (`attention_k_eq_v`), partial rotary on global layers, a value
norm, a final logit soft-cap, layers that reuse an earlier layer's keys and
values (`num_kv_shared_layers`), per-layer input embeddings, a learned
per-layer output scalar and a mixture-of-experts block. `gemma4_e2b()` to
`gemma4_26b_a4b()` are its text decoders (transformers' `Gemma4TextConfig`
and google-deepmind/gemma's `gemma4` sizes); `tiny_gemma4_*()` keep one
size's structure at test width.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from typing import Any

from graftjax.kernels import dots
from graftjax.kernels import registry
from graftjax.models.gemma import schemes


class AttentionType(enum.Enum):
  """Which keys a layer's queries may see."""

  GLOBAL = 'global'
  LOCAL_SLIDING = 'local_sliding'


# The numerics-relevant ops (see ops.py), and the implementations `impl` sets for all of them.
# Each op also accepts every name registered for it (`kernels/registry.py`), such as
# attention's 'xla_split'.
OPS = registry.OPS
IMPLS = ('xla', 'pallas')

# 1e-6 as the GGUF stores it (float32), so a config read from the file is equal.
_GGUF_EPS = 9.999999974752427e-07

# How `GemmaConfig.digest` reads a config (see `GemmaConfig.to_json`).
#   1: every field in canonical JSON; per-op impls and dot_precision only when set.
#   2: fields added since (`_ADDED_FIELDS`) appear only when they differ from their
#      default, and then with 'digest_rule': 2, so adding a field never changes the
#      digest of a config that leaves it at its default.
DIGEST_RULE = 2
# The fields that make a Gemma 4 (defaults: Gemma 3).
GEMMA4_FIELDS = (
  'global_head_dim',
  'num_global_kv_heads',
  'attention_k_eq_v',
  'global_rotary_fraction',
  'value_norm',
  'final_logit_softcap',
  'num_kv_shared_layers',
  'double_wide_shared_mlp',
  'per_layer_input_dim',
  'layer_scalar',
  'num_experts',
  'top_k_experts',
  'expert_dim',
)
_ADDED_FIELDS = ('rope_scale_factor',) + GEMMA4_FIELDS

# Gemma 3 repeats five sliding-window layers then one global layer.
_GEMMA3_PATTERN = (AttentionType.LOCAL_SLIDING,) * 5 + (AttentionType.GLOBAL,)


def gemma3_attention_pattern(num_layers: int) -> tuple[AttentionType, ...]:
  return tuple(_GEMMA3_PATTERN[i % len(_GEMMA3_PATTERN)] for i in range(num_layers))


def attention_pattern(num_layers: int, local_per_global: int) -> tuple[AttentionType, ...]:
  """`local_per_global` sliding-window layers, then one global layer, repeated."""
  period = local_per_global + 1
  return tuple(
    AttentionType.GLOBAL if (i + 1) % period == 0 else AttentionType.LOCAL_SLIDING
    for i in range(num_layers)
  )


@dataclasses.dataclass(frozen=True)
class GemmaConfig:
  """Architecture of a Gemma 3 or Gemma 4 text decoder.

  Attributes:
    vocab_size: V, rows of the (tied) embedding table.
    embed_dim: D, width of the residual stream.
    hidden_dim: F, width of the gated MLP.
    num_heads: N, query heads.
    num_kv_heads: K, key/value heads (N is a multiple of K).
    head_dim: H, width of one head.
    attention_types: one entry per layer.
    sliding_window: W, a local layer's query at position p sees keys at
      positions p - W < q <= p.
    local_rope_theta: rotary base of local layers.
    global_rope_theta: rotary base of global layers.
    rope_scale_factor: linear rope scaling of global layers: their positions
      are divided by this factor (Gemma 3 4B and up: 8; local layers: none).
    query_scale: multiplies queries before the dot product
      (`query_pre_attn_scalar ** -0.5` in the published configs).
    rms_norm_eps: epsilon of every RMSNorm.
    position_scheme: how positions enter attention: a name registered in
      `schemes` ('rope', 'rope_f64', 'rope_relative', 'alibi', 'nope', ...).
    bos_id, eos_id, pad_id: special token ids.
    end_of_turn_id: `<end_of_turn>`; also stops generation.
    impl: 'xla' (default) or 'pallas' (chunk-invariant kernels; see ops.py),
      for every op without its own setting below. Only all-'pallas' is
      chunk-invariant; mixtures are for measuring what each op costs.
    attention_impl, matmul_impl, norm_impl, rotary_impl: the implementation
      of one op, or None for `impl`. Normalized on construction (a setting
      equal to `impl` becomes None; four equal settings become `impl`), so
      one computation has one config digest.
    dot_precision: of every float32 matrix product, a name in
      `kernels.dots.NAMES`: 'highest' (IEEE float32, the default) or a split
      into bfloat16 pieces ('bf16x3', 'bf16x6'; tensor cores on a GPU, and
      other bits). bfloat16 products are exact either way.
    global_head_dim: head width of global layers (None: `head_dim`; Gemma 4: 512).
    num_global_kv_heads: kv heads of global layers (None: `num_kv_heads`).
    attention_k_eq_v: global layers take values from the key projection (no
      'v' weight); keys are then k-normed and rotated, values v-normed.
    global_rotary_fraction: of a global layer's rotary pairs, the fraction
      that rotate ('proportional' rope: the first int(f H / 2) frequencies
      theta ** (-2i / H); the other pairs keep angle 0).
    value_norm: values pass an RMSNorm without scale.
    final_logit_softcap: logits become c tanh(logits / c) (None: no cap).
    num_kv_shared_layers: the last this many layers compute no keys or values:
      each reads those of the last earlier layer of its type, and caches none.
    double_wide_shared_mlp: those layers' MLP is twice `hidden_dim` wide.
    per_layer_input_dim: P > 0 adds per-layer input embeddings (a [V, L*P]
      table and a projection of the embedding) gated into each layer's output.
    layer_scalar: each layer's output is multiplied by a learned scalar.
    num_experts, top_k_experts, expert_dim: a mixture-of-experts block beside
      the dense MLP in every layer (0: none): E experts of width `expert_dim`,
      each token routed to its top k.
  """

  vocab_size: int
  embed_dim: int
  hidden_dim: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  attention_types: tuple[AttentionType, ...]
  sliding_window: int
  local_rope_theta: float = 10_000.0
  global_rope_theta: float = 1_000_000.0
  rope_scale_factor: float = 1.0
  query_scale: float | None = None
  rms_norm_eps: float = 1e-6
  position_scheme: str = 'rope'
  bos_id: int = 2
  eos_id: int = 1
  pad_id: int = 0
  end_of_turn_id: int | None = None
  impl: str = 'xla'
  attention_impl: str | None = None
  matmul_impl: str | None = None
  norm_impl: str | None = None
  rotary_impl: str | None = None
  dot_precision: str = 'highest'
  global_head_dim: int | None = None
  num_global_kv_heads: int | None = None
  attention_k_eq_v: bool = False
  global_rotary_fraction: float = 1.0
  value_norm: bool = False
  final_logit_softcap: float | None = None
  num_kv_shared_layers: int = 0
  double_wide_shared_mlp: bool = False
  per_layer_input_dim: int = 0
  layer_scalar: bool = False
  num_experts: int = 0
  top_k_experts: int = 0
  expert_dim: int = 0

  def __post_init__(self):
    if self.impl not in IMPLS:
      raise ValueError(f'impl must be one of {IMPLS}, got {self.impl!r}')
    for op in OPS:
      value = getattr(self, f'{op}_impl')
      known = registry.names(op)
      if value is not None and value not in known:
        raise ValueError(f'{op}_impl must be one of {known}, or None for impl; got {value!r}')
    per_op = {op: self.impl_of(op) for op in OPS}
    if len(set(per_op.values())) == 1:
      object.__setattr__(self, 'impl', per_op['attention'])
    for op, value in per_op.items():
      object.__setattr__(self, f'{op}_impl', None if value == self.impl else value)
    if self.dot_precision not in dots.NAMES:
      raise ValueError(f'dot_precision must be one of {dots.NAMES}, got {self.dot_precision!r}')
    for kv_heads in {self.num_kv_heads, self.num_global_kv_heads or self.num_kv_heads}:
      if kv_heads <= 0 or self.num_heads % kv_heads:
        raise ValueError(f'num_heads={self.num_heads} is not a multiple of kv heads {kv_heads}')
    for width in {self.head_dim, self.global_head_dim or self.head_dim}:
      if width <= 0 or width % 2:
        raise ValueError(f'head width {width} must be positive and even for rotary')
    self._check_gemma4_fields()
    if not self.rope_scale_factor >= 1.0:
      raise ValueError(f'rope_scale_factor must be >= 1, got {self.rope_scale_factor}')
    scheme = schemes.get(self.position_scheme)
    object.__setattr__(self, 'position_scheme', scheme.name)
    rotates_from_tables = scheme.angles == 'float64' or scheme.keys == schemes.Keys.RELATIVE
    if self.rope_scale_factor != 1.0 and rotates_from_tables:
      raise ValueError(
        f'rope_scale_factor={self.rope_scale_factor} is implemented for schemes with float32'
        f' angles, not {scheme.name!r}'
      )
    if self.query_scale is None:
      object.__setattr__(self, 'query_scale', self.head_dim**-0.5)

  def _check_gemma4_fields(self) -> None:
    if not 0.0 < self.global_rotary_fraction <= 1.0:
      raise ValueError(
        f'global_rotary_fraction must be in (0, 1], got {self.global_rotary_fraction}'
      )
    if self.final_logit_softcap is not None and not self.final_logit_softcap > 0:
      raise ValueError(f'final_logit_softcap must be positive, got {self.final_logit_softcap}')
    if min(self.num_kv_shared_layers, self.per_layer_input_dim, self.expert_dim) < 0:
      raise ValueError('num_kv_shared_layers, per_layer_input_dim and expert_dim must be >= 0')
    if not 0 <= self.num_kv_shared_layers < self.num_layers:
      raise ValueError(
        f'num_kv_shared_layers={self.num_kv_shared_layers} must leave one of the'
        f' {self.num_layers} layers computing its own keys and values'
      )
    first = self.num_layers - self.num_kv_shared_layers
    missing = {t for t in self.attention_types[first:]} - set(self.attention_types[:first])
    if missing:
      raise ValueError(
        f'kv-shared layers of type {sorted(t.value for t in missing)} have no earlier layer of'
        ' that type to read keys and values from'
      )
    if self.num_experts or self.top_k_experts or self.expert_dim:
      if not 0 < self.top_k_experts <= self.num_experts or self.expert_dim <= 0:
        raise ValueError(
          f'mixture of experts needs 0 < top_k_experts <= num_experts and expert_dim > 0, got'
          f' {self.top_k_experts} of {self.num_experts} experts of width {self.expert_dim}'
        )

  @property
  def num_layers(self) -> int:
    return len(self.attention_types)

  @property
  def num_groups(self) -> int:
    """Query heads per key/value head (of sliding-window layers; `groups_of` for any layer)."""
    return self.num_heads // self.num_kv_heads

  @property
  def is_moe(self) -> bool:
    return self.num_experts > 0

  def is_global(self, layer: int) -> bool:
    return self.attention_types[layer] == AttentionType.GLOBAL

  def head_dim_of(self, layer: int) -> int:
    """H of `layer`: `global_head_dim` on global layers where set, else `head_dim`."""
    return (self.global_head_dim or self.head_dim) if self.is_global(layer) else self.head_dim

  def kv_heads_of(self, layer: int) -> int:
    """K of `layer`: `num_global_kv_heads` on global layers where set, else `num_kv_heads`."""
    if self.is_global(layer):
      return self.num_global_kv_heads or self.num_kv_heads
    return self.num_kv_heads

  def groups_of(self, layer: int) -> int:
    """Query heads per kv head of `layer`."""
    return self.num_heads // self.kv_heads_of(layer)

  def k_eq_v(self, layer: int) -> bool:
    """Whether `layer`'s values come from its key projection."""
    return self.attention_k_eq_v and self.is_global(layer)

  def rotary_fraction(self, layer: int) -> float:
    """The fraction of `layer`'s rotary pairs that rotate."""
    return self.global_rotary_fraction if self.is_global(layer) else 1.0

  def kv_source(self, layer: int) -> int:
    """The layer whose keys and values `layer` attends over: itself, or for a kv-shared
    layer the last layer before the shared ones of the same attention type."""
    first = self.num_layers - self.num_kv_shared_layers
    if layer < first:
      return layer
    kind = self.attention_types[layer]
    return max(i for i in range(first) if self.attention_types[i] == kind)

  @property
  def cached_layers(self) -> tuple[int, ...]:
    """The layers that compute and cache keys and values (all but the kv-shared ones)."""
    return tuple(range(self.num_layers - self.num_kv_shared_layers))

  def mlp_dim(self, layer: int) -> int:
    """Width of `layer`'s dense MLP (doubled on kv-shared layers where configured)."""
    shared = layer >= self.num_layers - self.num_kv_shared_layers
    return self.hidden_dim * (2 if self.double_wide_shared_mlp and shared else 1)

  @property
  def uniform_kv(self) -> bool:
    """Whether every layer caches keys and values of one shape (K, H): Gemma 3."""
    return (self.global_head_dim or self.head_dim) == self.head_dim and (
      self.num_global_kv_heads or self.num_kv_heads
    ) == self.num_kv_heads

  def impl_of(self, op: str) -> str:
    """The name of the implementation that computes `op` (`registry.get(op, name)`)."""
    if op not in OPS:
      raise ValueError(f'unknown op {op!r}; ops: {OPS}')
    return getattr(self, f'{op}_impl') or self.impl

  def rope_theta(self, layer: int) -> float:
    if self.attention_types[layer] == AttentionType.GLOBAL:
      return self.global_rope_theta
    return self.local_rope_theta

  def rope_scale(self, layer: int) -> float:
    """Linear rope scaling of `layer`: positions are divided by it (1.0: none)."""
    if self.attention_types[layer] == AttentionType.GLOBAL:
      return self.rope_scale_factor
    return 1.0

  def window(self, layer: int) -> int | None:
    """Sliding window of `layer`, or None for a global layer."""
    if self.attention_types[layer] == AttentionType.LOCAL_SLIDING:
      return self.sliding_window
    return None

  def with_impl(self, impl: str, **per_op: str) -> GemmaConfig:
    """`impl` for every op, except those named in `per_op` (op -> impl)."""
    unknown = set(per_op) - set(OPS)
    if unknown:
      raise ValueError(f'unknown ops {sorted(unknown)}; ops: {OPS}')
    return self.replace(impl=impl, **{f'{op}_impl': per_op.get(op) for op in OPS})

  def replace(self, **changes: Any) -> GemmaConfig:
    return dataclasses.replace(self, **changes)

  def to_json(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out['attention_types'] = [t.value for t in self.attention_types]
    for op in OPS:  # absent unless set: digests of single-impl configs stay as they were
      if out[f'{op}_impl'] is None:
        del out[f'{op}_impl']
    if out['dot_precision'] == 'highest':  # likewise
      del out['dot_precision']
    defaults = {f.name: f.default for f in dataclasses.fields(self)}
    for name in _ADDED_FIELDS:  # digest rule 2
      if out[name] == defaults[name]:
        del out[name]
      else:
        out['digest_rule'] = DIGEST_RULE
    return out

  def digest(self) -> str:
    """SHA-256 of the canonical JSON form (rule `DIGEST_RULE`): part of a model fingerprint."""
    blob = json.dumps(self.to_json(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def gemma3_270m(**overrides: Any) -> GemmaConfig:
  """google/gemma-3-270m (values checked against the GGUF's metadata)."""
  cfg = GemmaConfig(
    vocab_size=262_144,
    embed_dim=640,
    hidden_dim=2048,
    num_heads=4,
    num_kv_heads=1,
    head_dim=256,
    attention_types=gemma3_attention_pattern(18),
    sliding_window=512,
    local_rope_theta=10_000.0,
    global_rope_theta=1_000_000.0,
    query_scale=256**-0.5,
    rms_norm_eps=_GGUF_EPS,
    end_of_turn_id=106,
  )
  return cfg.replace(**overrides) if overrides else cfg


def _gemma3(
  *,
  num_layers: int,
  embed_dim: int,
  hidden_dim: int,
  num_heads: int,
  num_kv_heads: int,
  head_dim: int = 256,
  query_pre_attn_scalar: float = 256,
  sliding_window: int = 1024,
  rope_scale_factor: float = 8.0,
  vocab_size: int = 262_208,
) -> GemmaConfig:
  """A Gemma 3 text decoder with the family's fixed choices (5 local : 1 global, thetas)."""
  return GemmaConfig(
    vocab_size=vocab_size,
    embed_dim=embed_dim,
    hidden_dim=hidden_dim,
    num_heads=num_heads,
    num_kv_heads=num_kv_heads,
    head_dim=head_dim,
    attention_types=gemma3_attention_pattern(num_layers),
    sliding_window=sliding_window,
    local_rope_theta=10_000.0,
    global_rope_theta=1_000_000.0,
    rope_scale_factor=rope_scale_factor,
    query_scale=query_pre_attn_scalar**-0.5,
    rms_norm_eps=1e-6,
    end_of_turn_id=106,
  )


def gemma3_1b(**overrides: Any) -> GemmaConfig:
  """google/gemma-3-1b: text only, vocabulary 262,144, window 512, no rope scaling."""
  cfg = _gemma3(
    num_layers=26,
    embed_dim=1152,
    hidden_dim=6912,
    num_heads=4,
    num_kv_heads=1,
    sliding_window=512,
    rope_scale_factor=1.0,
    vocab_size=262_144,
  )
  return cfg.replace(**overrides) if overrides else cfg


def gemma3_4b(**overrides: Any) -> GemmaConfig:
  """google/gemma-3-4b text decoder (vocabulary 262,208 with the image tokens)."""
  cfg = _gemma3(num_layers=34, embed_dim=2560, hidden_dim=10_240, num_heads=8, num_kv_heads=4)
  return cfg.replace(**overrides) if overrides else cfg


def gemma3_12b(**overrides: Any) -> GemmaConfig:
  """google/gemma-3-12b text decoder."""
  cfg = _gemma3(num_layers=48, embed_dim=3840, hidden_dim=15_360, num_heads=16, num_kv_heads=8)
  return cfg.replace(**overrides) if overrides else cfg


def gemma3_27b(**overrides: Any) -> GemmaConfig:
  """google/gemma-3-27b text decoder: head_dim 128, queries scaled by 168 ** -0.5 (D / N)."""
  cfg = _gemma3(
    num_layers=62,
    embed_dim=5376,
    hidden_dim=21_504,
    num_heads=32,
    num_kv_heads=16,
    head_dim=128,
    query_pre_attn_scalar=168,
  )
  return cfg.replace(**overrides) if overrides else cfg


def tiny(**overrides: Any) -> GemmaConfig:
  """A random-weight Gemma 3 for tests: 6 layers (5 local + 1 global)."""
  cfg = GemmaConfig(
    vocab_size=256,
    embed_dim=32,
    hidden_dim=64,
    num_heads=4,
    num_kv_heads=1,
    head_dim=16,
    attention_types=gemma3_attention_pattern(6),
    sliding_window=8,
    query_scale=16**-0.5,
  )
  return cfg.replace(**overrides) if overrides else cfg


def _gemma4(
  *,
  num_layers: int,
  local_per_global: int,
  embed_dim: int,
  hidden_dim: int,
  num_heads: int,
  num_kv_heads: int,
  sliding_window: int,
  vocab_size: int = 262_144,
  head_dim: int = 256,
  global_head_dim: int = 512,
  **fields: Any,
) -> GemmaConfig:
  """A Gemma 4 text decoder with the family's fixed choices: sliding layers of head size 256
  (rope base 1e4, full rotary), global layers of head size 512 (rope base 1e6, a quarter of
  the pairs rotating), q/k norms with scale, a value norm without, attention scaling 1,
  a learned layer scalar, final logit soft-cap 30, vocabulary 262,144, last layer global."""
  return GemmaConfig(
    vocab_size=vocab_size,
    embed_dim=embed_dim,
    hidden_dim=hidden_dim,
    num_heads=num_heads,
    num_kv_heads=num_kv_heads,
    head_dim=head_dim,
    attention_types=attention_pattern(num_layers, local_per_global),
    sliding_window=sliding_window,
    local_rope_theta=10_000.0,
    global_rope_theta=1_000_000.0,
    query_scale=1.0,
    rms_norm_eps=1e-6,
    global_head_dim=global_head_dim,
    global_rotary_fraction=0.25,
    value_norm=True,
    final_logit_softcap=30.0,
    layer_scalar=True,
    **fields,
  )


def gemma4_e2b(**overrides: Any) -> GemmaConfig:
  """google/gemma-4-E2B text decoder: 35 layers (4 sliding : 1 global), the last 20 reuse
  earlier keys and values with a double-wide MLP, per-layer inputs of 256."""
  cfg = _gemma4(
    num_layers=35,
    local_per_global=4,
    embed_dim=1536,
    hidden_dim=6144,
    num_heads=8,
    num_kv_heads=1,
    sliding_window=512,
    num_kv_shared_layers=20,
    double_wide_shared_mlp=True,
    per_layer_input_dim=256,
  )
  return cfg.replace(**overrides) if overrides else cfg


def gemma4_e4b(**overrides: Any) -> GemmaConfig:
  """google/gemma-4-E4B text decoder: 42 layers (5 : 1), the last 18 reuse earlier keys and
  values, per-layer inputs of 256."""
  cfg = _gemma4(
    num_layers=42,
    local_per_global=5,
    embed_dim=2560,
    hidden_dim=10_240,
    num_heads=8,
    num_kv_heads=2,
    sliding_window=512,
    num_kv_shared_layers=18,
    per_layer_input_dim=256,
  )
  return cfg.replace(**overrides) if overrides else cfg


def gemma4_31b(**overrides: Any) -> GemmaConfig:
  """google/gemma-4-31B text decoder: 60 layers (5 : 1), 32 heads, 16 kv heads on sliding
  layers and 4 on global ones, whose values come from the key projection (K=V)."""
  cfg = _gemma4(
    num_layers=60,
    local_per_global=5,
    embed_dim=5376,
    hidden_dim=21_504,
    num_heads=32,
    num_kv_heads=16,
    sliding_window=1024,
    num_global_kv_heads=4,
    attention_k_eq_v=True,
  )
  return cfg.replace(**overrides) if overrides else cfg


def gemma4_26b_a4b(**overrides: Any) -> GemmaConfig:
  """google/gemma-4-26B-A4B text decoder: 30 layers (5 : 1), K=V global layers of 2 kv heads,
  and in every layer 128 experts of width 704 (top 8) beside a dense MLP of 2,112."""
  cfg = _gemma4(
    num_layers=30,
    local_per_global=5,
    embed_dim=2816,
    hidden_dim=2112,
    num_heads=16,
    num_kv_heads=8,
    sliding_window=1024,
    num_global_kv_heads=2,
    attention_k_eq_v=True,
    num_experts=128,
    top_k_experts=8,
    expert_dim=704,
  )
  return cfg.replace(**overrides) if overrides else cfg


# Test widths of the Gemma 4 structures: head sizes 16 (sliding) and 32 (global).
_TINY_GEMMA4 = dict(
  vocab_size=256,
  embed_dim=32,
  hidden_dim=64,
  num_heads=4,
  sliding_window=8,
  head_dim=16,
  global_head_dim=32,
)


def _tiny_gemma4(num_layers: int, local_per_global: int, **fields: Any) -> GemmaConfig:
  return _gemma4(num_layers=num_layers, local_per_global=local_per_global, **_TINY_GEMMA4, **fields)


def tiny_gemma4_e2b(**overrides: Any) -> GemmaConfig:
  """E2B's structure at test width: 10 layers (4 : 1), the last 4 kv-shared with a double-wide
  MLP, per-layer inputs of 8, one kv head."""
  cfg = _tiny_gemma4(
    10,
    4,
    num_kv_heads=1,
    num_kv_shared_layers=4,
    double_wide_shared_mlp=True,
    per_layer_input_dim=8,
  )
  return cfg.replace(**overrides) if overrides else cfg


def tiny_gemma4_31b(**overrides: Any) -> GemmaConfig:
  """31B's structure at test width: 6 layers (5 : 1), 2 kv heads on sliding layers, 1 on the
  K=V global one."""
  cfg = _tiny_gemma4(6, 5, num_kv_heads=2, num_global_kv_heads=1, attention_k_eq_v=True)
  return cfg.replace(**overrides) if overrides else cfg


def tiny_gemma4_26b(**overrides: Any) -> GemmaConfig:
  """26B-A4B's structure at test width: 6 layers (5 : 1), K=V global layer, 8 experts of
  width 16 (top 2) beside the dense MLP."""
  cfg = _tiny_gemma4(
    6,
    5,
    num_kv_heads=2,
    num_global_kv_heads=1,
    attention_k_eq_v=True,
    num_experts=8,
    top_k_experts=2,
    expert_dim=16,
  )
  return cfg.replace(**overrides) if overrides else cfg


NAMED_CONFIGS = {
  'gemma3-270m': gemma3_270m,
  'gemma3-1b': gemma3_1b,
  'gemma3-4b': gemma3_4b,
  'gemma3-12b': gemma3_12b,
  'gemma3-27b': gemma3_27b,
  'tiny': tiny,
  'gemma4-e2b': gemma4_e2b,
  'gemma4-e4b': gemma4_e4b,
  'gemma4-31b': gemma4_31b,
  'gemma4-26b-a4b': gemma4_26b_a4b,
  'tiny-gemma4-e2b': tiny_gemma4_e2b,
  'tiny-gemma4-31b': tiny_gemma4_31b,
  'tiny-gemma4-26b': tiny_gemma4_26b,
}


def get_config(name: str, **overrides: Any) -> GemmaConfig:
  try:
    factory = NAMED_CONFIGS[name]
  except KeyError:
    raise ValueError(f'unknown model config {name!r}; known: {sorted(NAMED_CONFIGS)}') from None
  return factory(**overrides)
