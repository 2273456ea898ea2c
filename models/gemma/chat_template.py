"""A checkpoint's chat template, rendered with jinja2's sandboxed environment.

    template = chat_template.beside('/ckpt/gemma-3-1b-it')   # or tokenizer.chat_template
    text = template.render([{'role': 'user', 'content': 'Hi'}])
    ids = tokenizer.encode(text, add_bos=False)              # the template writes <bos>

An instruction-tuned checkpoint answers well only inside the template it was tuned with.
Hugging Face folders ship it as `chat_template.jinja` or as the `chat_template` field of
`tokenizer_config.json` (a string, or a list of named templates of which 'default' is
used). It is rendered as transformers renders it: jinja2's `ImmutableSandboxedEnvironment`
(a template cannot reach Python objects' internals or mutate its inputs), `trim_blocks` and
`lstrip_blocks`, the loop-controls extension, `raise_exception(message)` and a `tojson`
filter, with `messages`, `add_generation_prompt`, `bos_token` and `eos_token` defined.
The rendered text holds control tokens as text (`<start_of_turn>`): encode it with
`parse_special=True` (the default) and without another BOS.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from graftjax.errors import GraftjaxError

CHAT_TEMPLATE_FILE = 'chat_template.jinja'
TOKENIZER_CONFIG = 'tokenizer_config.json'
_CONTENT_MARK = '\ue000graftjax-content\ue000'  # a private-use sentinel no template writes


class ChatTemplateError(GraftjaxError, ValueError):
  """A template that does not parse, raises while rendering, or cannot wrap one message."""


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """A jinja2 chat template and the special-token text it is rendered with."""

  source: str
  bos_token: str = '<bos>'
  eos_token: str = '<eos>'

  def render(
    self,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    **variables: Any,
  ) -> str:
    """The conversation `messages` ({'role', 'content'} each) as the model reads it.

    Raises:
      ChatTemplateError: the template does not parse, or raises (e.g. roles that do not
        alternate), naming the cause.
    """
    import jinja2

    try:
      compiled = _environment().from_string(self.source)
      return compiled.render(
        messages=[dict(m) for m in messages],
        add_generation_prompt=add_generation_prompt,
        bos_token=self.bos_token,
        eos_token=self.eos_token,
        **variables,
      )
    except jinja2.TemplateError as e:
      raise ChatTemplateError(f'the chat template failed: {type(e).__name__}: {e}') from e

  def wrap(self) -> tuple[str, str]:
    """(head, tail): the text before and after a single user message's content, with the
    generation prompt; `head + content + tail` is that message rendered.

    Raises:
      ChatTemplateError: the template does not write a message's content exactly once.
    """
    text = self.render([{'role': 'user', 'content': _CONTENT_MARK}])
    if text.count(_CONTENT_MARK) != 1:
      raise ChatTemplateError("the chat template does not write a user message's content once")
    head, tail = text.split(_CONTENT_MARK)
    return head, tail

  def end_of_turn(self) -> str:
    """The text the template writes right after a model turn's content (e.g. '<end_of_turn>'),
    up to the line's end: where an answer in the chat form ends."""
    mark = _CONTENT_MARK
    text = self.render(
      [{'role': 'user', 'content': 'q'}, {'role': 'assistant', 'content': mark}],
      add_generation_prompt=False,
    )
    if text.count(mark) != 1:
      raise ChatTemplateError("the chat template does not write a model turn's content once")
    after = text.split(mark)[1].split('\n')[0]
    if not after:
      raise ChatTemplateError('the chat template writes nothing after a model turn')
    return after

  def digest(self) -> str:
    """Hex SHA-256 of the template and the special-token text it is rendered with."""
    blob = json.dumps([self.source, self.bos_token, self.eos_token], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def _raise(message: str):
  raise ChatTemplateError(f'the chat template raised: {message}')


def _environment():
  from jinja2 import ext
  from jinja2 import sandbox

  env = sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols]
  )
  env.globals['raise_exception'] = _raise
  env.filters['tojson'] = lambda value, indent=None: json.dumps(
    value, ensure_ascii=False, indent=indent
  )
  return env


def beside(folder: str | os.PathLike) -> ChatTemplate | None:
  """The chat template of a checkpoint or tokenizer folder, or None if it ships none.

  chat_template.jinja first, else tokenizer_config.json's `chat_template`; the BOS and EOS
  text from tokenizer_config.json (`bos_token`, `eos_token`) where it gives them.

  Raises:
    ChatTemplateError: a `chat_template` field of another shape.
  """
  folder = pathlib.Path(folder)
  config_path = folder / TOKENIZER_CONFIG
  config = json.loads(config_path.read_text(encoding='utf-8')) if config_path.is_file() else {}
  specials = {}
  for role in ('bos', 'eos'):
    value = config.get(f'{role}_token')
    value = value.get('content') if isinstance(value, dict) else value
    if isinstance(value, str):
      specials[f'{role}_token'] = value
  jinja_path = folder / CHAT_TEMPLATE_FILE
  if jinja_path.is_file():
    return ChatTemplate(jinja_path.read_text(encoding='utf-8'), **specials)
  source = config.get('chat_template')
  if source is None:
    return None
  if isinstance(source, list):
    named = {t.get('name'): t.get('template') for t in source if isinstance(t, dict)}
    source = named.get('default')
  if not isinstance(source, str):
    raise ChatTemplateError(
      f"{config_path}: chat_template is neither a string nor a list holding a 'default'"
    )
  return ChatTemplate(source, **specials)
