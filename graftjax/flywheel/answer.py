"""Graft -> answer: a routed block at its own slots, then the query, then a short decode.

`answer` grafts the block (read and digest-verified by the store) into a
cache of the library's shape, prefills the query after it (optionally after a
preamble, such as the base model's few-shot examples) and decodes under a
small budget. `answer_prompted` computes the same text as a plain prompt
with the same chunk schedule; its logits are byte-equal to the grafted ones
(tested), so the graft changes the cost, never the answer.

Both prefill the query in a region padded to a multiple of the library's
`chunk_size` (`query_chunks`): the query right-aligned, the padding slots
before it at position -1, which no query attends to (as `solve` pads its
prompts). Queries of any length in one bucket so run the programs already
compiled, and a block installs through `restore`'s row buckets: a new block
or query length in a bucket already seen costs no compilation. Near the
capacity, where a whole last chunk does not fit, the query's last part runs
in power-of-two chunks, so any room left compiles one of a few shapes.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from graftjax import restore as restore_lib
from graftjax.flywheel import library as library_lib
from graftjax.models import cache as cache_lib
from graftjax.models.gemma import sampler

MODES = {
  'recall': library_lib.RECALL_QUERY,
  'solve': library_lib.SOLVE_QUERY,
  'code': library_lib.CODE_QUERY,
}


@dataclasses.dataclass(frozen=True)
class Answer:
  """What the model said after a context.

  Attributes:
    token_ids: generated ids, up to and including the stop token.
    text: their text (control tokens skipped).
    context_tokens: tokens before the query (the block's; 0 without one).
    query_tokens: tokens of the preamble and query, prefilled after the context.
    first_logits: [V] float32 logits that chose the first generated token.
    seconds: wall time from an empty cache to the last token.
  """

  token_ids: tuple[int, ...]
  text: str
  context_tokens: int
  query_tokens: int
  first_logits: np.ndarray
  seconds: float


def chat_frame(model) -> tuple[str, str, int]:
  """(head, tail, end-of-turn id) of the chat form: a question's text goes between head and
  tail (one user turn, the model's turn opened), and the model's turn ends at that id.

  Raises:
    ValueError: the model's tokenizer has no chat template, or its end of turn is not one
      token.
  """
  template = getattr(model.tokenizer, 'chat_template', None)
  if template is None:
    raise ValueError("this model's tokenizer has no chat template: ask without the chat form")
  head, tail = template.wrap()
  end = model.tokenizer.encode(template.end_of_turn(), add_bos=False)
  if len(end) != 1:
    raise ValueError(f'{template.end_of_turn()!r} is not one token in this vocabulary: {end}')
  return head, tail, end[0]


def stop_ids(model, mode: str, *, chat: bool = False) -> tuple[int, ...]:
  """A recall answer ends at the line's end; a solution at its blank line; code at its closing
  fence (or EOS); in the chat form, also at the end of the model's turn."""
  ends = {'recall': ('\n', '\n\n'), 'code': ('```',)}.get(mode, ('\n\n',))
  out = []
  for text in ends:
    ids = model.tokenizer.encode(text, add_bos=False)
    if len(ids) != 1:
      raise ValueError(f'{text!r} is not one token in this vocabulary: {ids}')
    out.append(ids[0])
  if chat:
    out.append(chat_frame(model)[2])
  return (*out, model.config.eos_id)


def query_ids(
  model, question: str, *, mode: str, after_block: bool, preamble: str = '', chat: bool = False
) -> list[int]:
  """The token ids of `preamble` and the query; BOS only when nothing comes before them.

  `chat`: the text as one user turn of the model's chat template (`chat_frame`); after a
  block the template's BOS is left out (the block holds one).
  """
  if mode not in MODES:
    raise ValueError(f'mode must be one of {sorted(MODES)}, got {mode!r}')
  text = preamble + MODES[mode].format(question=question)
  if not chat:
    return model.tokenizer.encode(text, add_bos=not after_block)
  head, tail, _ = chat_frame(model)
  bos = model.tokenizer.chat_template.bos_token
  writes_bos = head.startswith(bos)
  if after_block and writes_bos:
    head = head[len(bos) :]
  return model.tokenizer.encode(head + text + tail, add_bos=not (after_block or writes_bos))


def answer(
  model,
  library: library_lib.Library,
  entry: library_lib.Entry | None,
  question: str,
  *,
  mode: str,
  max_new_tokens: int,
  preamble: str = '',
  chat: bool = False,
) -> Answer:
  """Grafts `entry`'s block (none: the base model alone), asks `question`, decodes.

  `preamble` (e.g. few-shot examples) comes between the block and the query; `chat` asks in
  the chat form (`query_ids`), the answer ending at the end of the model's turn. The entry is
  checked against its block's manifest before anything is grafted (`Library.check`).

  Raises:
    library.BindingError: the entry does not match its block (another item's block, a token
      count or text that is not the block's).
    store.StoreError: the block is missing or does not verify.
  """
  start = time.perf_counter()
  context = 0
  if entry is not None:
    context = len(library.check(entry, model).token_ids)
  cache = model.init_cache(capacity=library.shape.capacity)
  if entry is not None:
    cache = restore_lib.restore(
      library.store,
      entry.key,
      cache,
      target=model.graft_target,
      chunk_size=library.shape.chunk_size,  # `answer_prompted` prefills the same text so
      donate=True,
    )
  return _continue(
    model, library, cache, context, question, mode, max_new_tokens, preamble, start, chat
  )


def answer_prompted(
  model,
  library: library_lib.Library,
  entry: library_lib.Entry,
  question: str,
  *,
  mode: str,
  max_new_tokens: int,
  preamble: str = '',
  chat: bool = False,
) -> Answer:
  """The same context as `answer`, computed from its text instead of grafted (as the deposit
  computed it: `library.prefill_text`)."""
  start = time.perf_counter()
  ids = model.tokenizer.encode(entry.text)
  cache = model.init_cache(capacity=library.shape.capacity)
  cache = library_lib.prefill_text(model, ids, cache, chunk_size=library.shape.chunk_size)
  return _continue(
    model, library, cache, len(ids), question, mode, max_new_tokens, preamble, start, chat
  )


def greedy(
  model,
  last: jax.Array,
  cache,
  position: int,
  *,
  mode: str,
  max_new_tokens: int,
  chat: bool = False,
) -> tuple[tuple[int, ...], str]:
  """(ids, text) decoded greedily from `last` [1, V] logits, the first new token at `position`.

  The ids run up to and including `mode`'s stop token (`stop_ids`); the text skips control
  tokens. The cache must hold `max_new_tokens` more slots.
  """
  tokens, _, steps, _ = sampler.decode(
    model.params,
    last,
    jnp.full((1,), position, jnp.int32),
    cache,
    jax.random.key(0),
    config=model.config,
    max_new_tokens=max_new_tokens,
    stop_ids=stop_ids(model, mode, chat=chat),
    tables=model.tables,
  )
  ids = tuple(int(t) for t in np.asarray(tokens)[0, : int(steps)])
  return ids, model.tokenizer.decode(ids, skip_special=True)


def query_chunks(
  n: int, *, context: int, max_new_tokens: int, shape: library_lib.Shape
) -> tuple[int, ...]:
  """Widths of the chunks that prefill a query of n tokens after `context` ones.

  Whole chunks of `shape.chunk_size` (n rounded up) where the capacity leaves room for them
  and `max_new_tokens`; otherwise whole chunks for the query's first tokens, then its
  remainder padded to a power of two if that fits, else split into power-of-two chunks (no
  padding). The widths are then always among chunk_size, 1, 2, 4, ...: a sweep of query,
  context or budget lengths near the capacity compiles a few shapes, not one per room.
  """
  chunk = shape.chunk_size
  room = shape.capacity - context - max_new_tokens
  if -(-n // chunk) * chunk <= room:
    return (chunk,) * -(-n // chunk)
  whole, rest = divmod(n, chunk)
  padded = 1 << (rest - 1).bit_length() if rest else 0
  if whole * chunk + padded <= room:
    return (chunk,) * whole + ((padded,) if padded else ())
  return (chunk,) * whole + tuple(
    1 << b for b in reversed(range(rest.bit_length())) if rest >> b & 1
  )


def prefill_query(model, ids, cache, *, context: int, chunks: tuple[int, ...]):
  """(last [1, V] logits, cache): `ids` right-aligned in sum(chunks) slots after `context`.

  The slots before the query hold padding at position -1; the query's tokens are at
  positions context, context + 1, ...; one forward call per entry of `chunks`, in order.
  """
  region = sum(chunks)
  tokens = np.full((1, region), model.config.pad_id, np.int32)
  positions = np.full((1, region), cache_lib.EMPTY_POSITION, np.int32)
  tokens[0, region - len(ids) :] = ids
  positions[0, region - len(ids) :] = context + np.arange(len(ids))
  last, begin = None, 0
  for index, width in enumerate(chunks):
    chunk = slice(begin, begin + width)
    final = index == len(chunks) - 1
    last, cache = model.forward(
      tokens[:, chunk], positions[:, chunk], cache, logits='last' if final else 'none'
    )
    begin += width
  return last, cache


def _continue(
  model, library, cache, context, question, mode, max_new_tokens, preamble, start, chat
) -> Answer:
  ids = query_ids(model, question, mode=mode, after_block=context > 0, preamble=preamble, chat=chat)
  if context + len(ids) + max_new_tokens > library.shape.capacity:
    raise ValueError(
      f'context {context} + query {len(ids)} + {max_new_tokens} new tokens exceed the'
      f' library capacity {library.shape.capacity}'
    )
  chunks = query_chunks(
    len(ids), context=context, max_new_tokens=max_new_tokens, shape=library.shape
  )
  last, cache = prefill_query(model, ids, cache, context=context, chunks=chunks)
  generated, text = greedy(
    model, last, cache, context + len(ids), mode=mode, max_new_tokens=max_new_tokens, chat=chat
  )
  return Answer(
    token_ids=generated,
    text=text,
    context_tokens=context,
    query_tokens=len(ids),
    first_logits=np.asarray(last[0]),
    seconds=time.perf_counter() - start,
  )
