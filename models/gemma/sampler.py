"""Decoding: a jitted `lax.while_loop` over a state dataclass.

Greedy, temperature, top-k and top-p sampling from an explicit PRNG key;
stops on a stop token or a token budget. Returns the tokens and, when
asked, each step's logits.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import struct

from graftjax.models import cache as cache_lib
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import transformer


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """temperature 0 means greedy; top_k 0 and top_p 1.0 mean no truncation."""

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f'temperature must be >= 0, got {self.temperature}')
    if self.top_k < 0:
      raise ValueError(f'top_k must be >= 0, got {self.top_k}')
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f'top_p must be in (0, 1], got {self.top_p}')


@struct.dataclass
class DecodeState:
  """Loop state.

  Attributes:
    step: [] number of tokens generated so far.
    last_logits: [B, V] logits that choose the next token.
    next_position: [B] position of the next token.
    tokens: [B, N] generated tokens (pad after a stop).
    logits: [B, N, V] per-step logits, or [B, 0, V] when not kept.
    done: [B] bool, a stop token was produced.
    cache: the KV cache.
    rng: PRNG key.
  """

  step: jax.Array
  last_logits: jax.Array
  next_position: jax.Array
  tokens: jax.Array
  logits: jax.Array
  done: jax.Array
  cache: cache_lib.KVCache
  rng: jax.Array


def choose_token(logits: jax.Array, rng: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """Next token [B] from logits [B, V]."""
  if sampling.temperature == 0.0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits.astype(jnp.float32) / sampling.temperature
  if sampling.top_k:
    kth = jax.lax.top_k(logits, sampling.top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if sampling.top_p < 1.0:
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
    # Keep the smallest prefix whose mass reaches top_p (always the top token).
    cutoff_index = jnp.sum(cumulative < sampling.top_p, axis=-1, keepdims=True)
    cutoff = jnp.take_along_axis(sorted_logits, cutoff_index, axis=-1)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


@functools.partial(
  jax.jit,
  static_argnames=('config', 'max_new_tokens', 'sampling', 'stop_ids', 'keep_logits'),
  donate_argnames=('cache',),
)
def decode(
  params,
  last_logits: jax.Array,
  next_position: jax.Array,
  cache: cache_lib.KVCache,
  rng: jax.Array,
  *,
  config: config_lib.GemmaConfig,
  max_new_tokens: int,
  sampling: SamplingConfig = SamplingConfig(),
  stop_ids: tuple[int, ...] = (),
  keep_logits: bool = False,
  tables=None,
):
  """Generates up to `max_new_tokens` tokens, one forward pass per token.

  Args:
    params: model params.
    last_logits: [B, V] logits after the prompt (choose the first token).
    next_position: [B] int32 position of the first generated token.
    cache: cache holding the prompt, with room for max_new_tokens more.
    rng: PRNG key (unused for greedy).
    config: model config.
    max_new_tokens: token budget N.
    sampling: greedy/temperature/top-k/top-p.
    stop_ids: a row stops after producing one of these.
    keep_logits: also return each step's logits [B, N, V].
    tables: position tables of the model's scheme.
  Returns:
    (tokens [B, N] with pad 0 after a stop, logits [B, N, V] or None,
     number of steps run, final cache).
  """
  batch, vocab = last_logits.shape
  stops = jnp.asarray(stop_ids or (-1,), jnp.int32)
  state = DecodeState(
    step=jnp.zeros((), jnp.int32),
    last_logits=last_logits.astype(jnp.float32),
    next_position=next_position.astype(jnp.int32),
    tokens=jnp.full((batch, max_new_tokens), config.pad_id, jnp.int32),
    logits=jnp.zeros((batch, max_new_tokens if keep_logits else 0, vocab), jnp.float32),
    done=jnp.zeros((batch,), bool),
    cache=cache,
    rng=rng,
  )

  def cond(s: DecodeState):
    return (s.step < max_new_tokens) & ~jnp.all(s.done)

  def body(s: DecodeState):
    rng, step_rng = jax.random.split(s.rng)
    token = choose_token(s.last_logits, step_rng, sampling)
    token = jnp.where(s.done, config.pad_id, token)
    tokens = s.tokens.at[:, s.step].set(token)
    logits_kept = s.logits
    if keep_logits:
      logits_kept = jax.lax.dynamic_update_slice(s.logits, s.last_logits[:, None], (0, s.step, 0))
    done = s.done | jnp.any(token[:, None] == stops[None, :], axis=-1)
    next_logits, cache = transformer.forward(
      params,
      token[:, None],
      s.next_position[:, None],
      s.cache,
      config=config,
      logits='last',
      tables=tables,
    )
    return DecodeState(
      step=s.step + 1,
      last_logits=next_logits,
      next_position=s.next_position + 1,
      tokens=tokens,
      logits=logits_kept,
      done=done,
      cache=cache,
      rng=rng,
    )

  final = jax.lax.while_loop(cond, body, state)
  return final.tokens, (final.logits if keep_logits else None), final.step, final.cache


def generate(
  model,
  prompt_ids,
  *,
  max_new_tokens: int,
  capacity: int | None = None,
  chunk_size: int = 256,
  sampling: SamplingConfig = SamplingConfig(),
  rng: jax.Array | None = None,
  stop_ids: tuple[int, ...] | None = None,
  keep_logits: bool = False,
):
  """Prefills one prompt in fixed chunks, then decodes (batch 1).

  Returns:
    dict with 'tokens' (list[int], up to and including a stop token),
    'logits' ([n, V] float32, the logits each token was chosen from) if asked,
    and 'cache'.
  """
  import numpy as np

  prompt = np.asarray(prompt_ids, np.int32)
  capacity = capacity or prompt.size + max_new_tokens
  if prompt.size + max_new_tokens > capacity:
    raise ValueError(
      f'prompt {prompt.size} + {max_new_tokens} new tokens exceed capacity {capacity}'
    )
  if stop_ids is None:
    stop_ids = tuple(t for t in (model.config.eos_id, model.config.end_of_turn_id) if t is not None)
  last, cache = model.prefill(
    prompt, cache=model.init_cache(capacity=capacity), chunk_size=chunk_size, logits='last'
  )
  tokens, logits, steps, cache = decode(
    model.params,
    last,
    jnp.full((1,), prompt.size, jnp.int32),
    cache,
    rng if rng is not None else jax.random.key(0),
    config=model.config,
    max_new_tokens=max_new_tokens,
    sampling=sampling,
    stop_ids=tuple(stop_ids),
    keep_logits=keep_logits,
    tables=model.tables,
  )
  n = int(steps)
  out = {'tokens': [int(t) for t in np.asarray(tokens)[0, :n]], 'cache': cache}
  if keep_logits:
    out['logits'] = np.asarray(logits)[0, :n]
  return out
