"""Errors of automatic prefix reuse; each names its cause."""

from graftjax.errors import GraftjaxError


class PrefixError(GraftjaxError, ValueError):
  """A prompt cannot be served as asked; nothing was stored or changed."""


class PromptTooLongError(PrefixError):
  """A prompt (with the tokens to generate) does not fit the engine's cache."""


class SpanMismatchError(PrefixError):
  """A stored span is not what the index says: other tokens, positions or model."""


class LogError(GraftjaxError, OSError):
  """The span log under the store cannot be read or appended to."""
