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

Rendering is bounded, since a template is code from the checkpoint's author: it stops with
`ChatTemplateError` after `max_seconds` (a trace on the template's own frames checks the
clock at every line, so loops and recursion that write nothing stop too), and any string or
list it would build past `max_chars` (repetition, `**`, `+`, `~`, `%` and format widths,
filter and call arguments) is refused before it is built, as is output past `max_chars`.
Every failure while rendering, of any kind (a TypeError, ZeroDivisionError, RecursionError,
OverflowError, MemoryError ...), is a `ChatTemplateError` naming its kind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from graftjax.errors import GraftjaxError

CHAT_TEMPLATE_FILE = 'chat_template.jinja'
TOKENIZER_CONFIG = 'tokenizer_config.json'
_CONTENT_MARK = '\ue000graftjax-content\ue000'  # a private-use sentinel no template writes
MAX_SECONDS = 2.0  # a published Gemma template renders a conversation in milliseconds
MAX_CHARS = 4_000_000  # of the rendered text, and of any string or list built on the way
_TEMPLATE_FILE = '<template>'  # the file name jinja2 compiles a template from a string under


class ChatTemplateError(GraftjaxError, ValueError):
  """A template that does not parse, raises while rendering, or cannot wrap one message."""


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """A jinja2 chat template and the special-token text it is rendered with; rendering stops
  after `max_seconds` or past `max_chars` (neither enters the digest)."""

  source: str
  bos_token: str = '<bos>'
  eos_token: str = '<eos>'
  max_seconds: float = dataclasses.field(default=MAX_SECONDS, compare=False)
  max_chars: int = dataclasses.field(default=MAX_CHARS, compare=False)

  def render(
    self,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    **variables: Any,
  ) -> str:
    """The conversation `messages` ({'role', 'content'} each) as the model reads it.

    Raises:
      ChatTemplateError: the template does not parse, raises (e.g. roles that do not
        alternate), fails in any other way, runs past `max_seconds` or would write or build
        more than `max_chars`; naming the cause.
    """
    budget = _Budget(self.max_seconds, self.max_chars)
    try:
      compiled = _environment(budget).from_string(self.source)
      namespace = compiled.root_render_func.__globals__
      for name in ('str_join', 'markup_join'):  # what `~` and output joins call
        namespace[name] = budget.bounded(namespace[name], name='~')
      chunks = compiled.generate(
        messages=[dict(m) for m in messages],
        add_generation_prompt=add_generation_prompt,
        bos_token=self.bos_token,
        eos_token=self.eos_token,
        **variables,
      )
      with budget.traced():
        written = 0
        out = []
        for chunk in chunks:
          written += len(chunk)
          budget.check_size(written, 'the rendered text')
          out.append(chunk)
        return ''.join(out)
    except ChatTemplateError:
      raise
    except Exception as e:  # the template is foreign code: whatever it raises is its failure
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


class _Budget:
  """The bounds of one rendering: a deadline, checked by a trace of the template's frames,
  and a size that strings and lists it builds may not pass."""

  def __init__(self, max_seconds: float, max_chars: int):
    self.max_seconds, self.max_chars = max_seconds, max_chars
    self.deadline = time.monotonic() + max_seconds

  def check_time(self) -> None:
    if time.monotonic() > self.deadline:
      raise ChatTemplateError(
        f'the chat template ran past its bound of {self.max_seconds} s (a loop or recursion'
        ' that does not end soon)'
      )

  def check_size(self, size: int, what: str) -> None:
    if size > self.max_chars:
      raise ChatTemplateError(
        f'the chat template would build {what} of {size} items, past its bound of {self.max_chars}'
      )

  def check_arguments(self, args, kwargs, what: str) -> None:
    """Refuses an int argument (a width, a count) past the bound."""
    for value in (*args, *kwargs.values()):
      if isinstance(value, int) and not isinstance(value, bool) and abs(value) > self.max_chars:
        self.check_size(abs(value), f'{what} (an argument)')

  def check_format(self, text: str, what: str) -> None:
    """Refuses a width or precision past the bound in a '%' or '{}' format string."""
    specs = _PERCENT_SPEC.findall(text) + _BRACE_SPEC.findall(text)
    for width in (w for spec in specs for w in _DIGITS.findall(spec)):
      if len(width) > len(str(self.max_chars)) or int(width) > self.max_chars:
        self.check_size(int(width[:40]), f'{what} (a format width)')

  def check_result(self, value, what: str):
    if isinstance(value, (str, list, tuple)):
      self.check_size(len(value), what)
    return value

  def bounded(self, function, *, name: str):
    """`function` with its int arguments and its result bounded."""

    def call(*args, **kwargs):
      self.check_arguments(args, kwargs, name)
      return self.check_result(function(*args, **kwargs), name)

    return call

  def binop(self, operator: str, left, right):
    """The size of `left operator right` checked before it is computed."""
    sized = (str, list, tuple)
    if operator == '*':
      for seq, count in ((left, right), (right, left)):
        if isinstance(seq, sized) and isinstance(count, int):
          self.check_size(len(seq) * max(count, 0), "a repeated string or list ('*')")
    elif operator == '+' and isinstance(left, sized) and isinstance(right, sized):
      self.check_size(len(left) + len(right), "a joined string or list ('+')")
    elif operator == '**' and isinstance(left, int) and isinstance(right, int) and right > 0:
      self.check_size(max(abs(left).bit_length(), 1) * right // 8, "a power's bytes ('**')")
    elif operator == '%' and isinstance(left, str):
      self.check_format(left, "'%'")
      self.check_arguments(right if isinstance(right, tuple) else (right,), {}, "'%'")
    return self.check_result(_BINOPS[operator](left, right), f"a result of '{operator}'")

  def traced(self):
    """A context in which every line the template's own code runs checks the clock (other
    frames are left to the tracer already installed, if any)."""
    return _Trace(self)


_PERCENT_SPEC = re.compile(r'%[-#0 +]*\d*(?:\.\d*)?')
_BRACE_SPEC = re.compile(r'\{[^{}]*\}')
_DIGITS = re.compile(r'\d+')
_BINOPS = {
  '+': lambda a, b: a + b,
  '-': lambda a, b: a - b,
  '*': lambda a, b: a * b,
  '/': lambda a, b: a / b,
  '//': lambda a, b: a // b,
  '%': lambda a, b: a % b,
  '**': lambda a, b: a**b,
}


class _Trace:
  def __init__(self, budget: _Budget):
    self.budget = budget

  def __enter__(self):
    self.previous = sys.gettrace()
    previous, check = self.previous, self.budget.check_time

    def on_call(frame, event, arg):
      outer = previous(frame, event, arg) if previous is not None else None
      if frame.f_code.co_filename != _TEMPLATE_FILE:
        return outer
      check()

      def on_line(frame, event, arg):
        nonlocal outer
        check()
        if outer is not None:
          outer = outer(frame, event, arg)
        return on_line

      return on_line

    sys.settrace(on_call)
    return self

  def __exit__(self, *exc):
    sys.settrace(self.previous)
    return False


def _environment(budget: _Budget):
  from jinja2 import ext
  from jinja2 import sandbox

  class Bounded(sandbox.ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(_BINOPS)

    def call_binop(self, context, operator, left, right):
      return budget.binop(operator, left, right)

    def wrap_str_format(self, value):  # a str's format method, as the template reads it
      wrapped = super().wrap_str_format(value)
      if wrapped is not None:
        budget.check_format(value.__self__, 'str.format')
      return wrapped

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
      budget.check_time()
      budget.check_arguments(args, kwargs, 'a call')
      result = super().call(__context, __obj, *args, **kwargs)
      return budget.check_result(result, "a call's result")

  # Not optimized: the optimizer folds constant expressions ('{:>9999999999}'.format(1))
  # while compiling, outside every bound here.
  env = Bounded(
    trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols], optimized=False
  )
  env.globals['raise_exception'] = _raise
  env.filters['tojson'] = lambda value, indent=None: json.dumps(
    value, ensure_ascii=False, indent=indent
  )
  for name, function in list(env.filters.items()):
    env.filters[name] = _bounded_filter(budget, name, function)
  return env


def _bounded_filter(budget: _Budget, name: str, function):
  """A filter with its int arguments and its result bounded (`format`: its widths too);
  jinja2's marker of what it is passed first (context, environment) is kept."""
  pass_arg = getattr(function, 'jinja_pass_arg', None)
  skip = 1 if pass_arg is None else 2  # the marked argument, then the filtered value
  what = f'the {name!r} filter'

  def bounded(*args, **kwargs):
    budget.check_arguments(args[skip:], kwargs, what)
    if name == 'format' and len(args) > skip - 1 and isinstance(args[skip - 1], str):
      budget.check_format(args[skip - 1], what)
    return budget.check_result(function(*args, **kwargs), what)

  if pass_arg is not None:
    bounded.jinja_pass_arg = pass_arg
  return bounded


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
