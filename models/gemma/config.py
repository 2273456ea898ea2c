"""Gemma 3 configurations: frozen dataclasses with named sizes.

`gemma3_270m()` is the real google/gemma-3-270m; `gemma3_1b()` to
`gemma3_27b()` are the text decoders of the larger Gemma 3 models (values of
their published config.json files); `tiny()` is a random-weight model of the
same architecture (local/global pattern, sliding window, multi-query
attention, q/k norm, tied embeddings) small enough for unit tests.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from typing import Any

from graftjax.kernels import dots
from graftjax.models.gemma import schemes


class AttentionType(enum.Enum):
  """Which keys a layer's queries may see."""

  GLOBAL = 'global'
  LOCAL_SLIDING = 'local_sliding'


# Implementations of the numerics-relevant ops (see ops.py), and those ops.
IMPLS = ('xla', 'pallas')
OPS = ('attention', 'matmul', 'norm', 'rotary')
# Implementations of one op only: attention's 'xla_split' (kernels/attention_xla_split.py).
OP_IMPLS = {'attention': ('xla_split',)}

# 1e-6 as the GGUF stores it (float32), so a config read from the file is equal.
_GGUF_EPS = 9.999999974752427e-07

# How `GemmaConfig.digest` reads a config (see `GemmaConfig.to_json`).
#   1: every field in canonical JSON; per-op impls and dot_precision only when set.
#   2: fields added since (`_ADDED_FIELDS`) appear only when they differ from their
#      default, and then with 'digest_rule': 2, so adding a field never changes the
#      digest of a config that leaves it at its default.
DIGEST_RULE = 2
_ADDED_FIELDS = ('rope_scale_factor',)

# Gemma 3 repeats five sliding-window layers then one global layer.
_GEMMA3_PATTERN = (AttentionType.LOCAL_SLIDING,) * 5 + (AttentionType.GLOBAL,)


def gemma3_attention_pattern(num_layers: int) -> tuple[AttentionType, ...]:
  return tuple(_GEMMA3_PATTERN[i % len(_GEMMA3_PATTERN)] for i in range(num_layers))


@dataclasses.dataclass(frozen=True)
class GemmaConfig:
  """Architecture of a Gemma 3 text decoder.

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

  def __post_init__(self):
    if self.impl not in IMPLS:
      raise ValueError(f'impl must be one of {IMPLS}, got {self.impl!r}')
    for op in OPS:
      value = getattr(self, f'{op}_impl')
      known = IMPLS + OP_IMPLS.get(op, ())
      if value is not None and value not in known:
        raise ValueError(f'{op}_impl must be one of {known}, or None for impl; got {value!r}')
    per_op = {op: self.impl_of(op) for op in OPS}
    if len(set(per_op.values())) == 1:
      object.__setattr__(self, 'impl', per_op['attention'])
    for op, value in per_op.items():
      object.__setattr__(self, f'{op}_impl', None if value == self.impl else value)
    if self.dot_precision not in dots.NAMES:
      raise ValueError(f'dot_precision must be one of {dots.NAMES}, got {self.dot_precision!r}')
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f'num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}'
      )
    if self.head_dim % 2:
      raise ValueError(f'head_dim={self.head_dim} must be even for rotary')
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

  @property
  def num_layers(self) -> int:
    return len(self.attention_types)

  @property
  def num_groups(self) -> int:
    """Query heads per key/value head."""
    return self.num_heads // self.num_kv_heads

  def impl_of(self, op: str) -> str:
    """'xla', 'pallas' (or one of `OP_IMPLS[op]`): the implementation that computes `op`."""
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


NAMED_CONFIGS = {
  'gemma3-270m': gemma3_270m,
  'gemma3-1b': gemma3_1b,
  'gemma3-4b': gemma3_4b,
  'gemma3-12b': gemma3_12b,
  'gemma3-27b': gemma3_27b,
  'tiny': tiny,
}


def get_config(name: str, **overrides: Any) -> GemmaConfig:
  try:
    factory = NAMED_CONFIGS[name]
  except KeyError:
    raise ValueError(f'unknown model config {name!r}; known: {sorted(NAMED_CONFIGS)}') from None
  return factory(**overrides)
