"""Automatic exact prefix reuse: the longest stored prefix of any prompt, at any token.

`Engine` (engine.py) looks prompts up in a prefix index over the block store (chained
span keys, keys.py; index.py), grafts what it finds through tiers of storage
(tiers.py), prefills the rest and deposits new spans, announced to other processes by
an append-only log under the store (log.py). Every use of the block API is in spans.py.
docs/prefix.md is the guide.
"""

from graftjax.prefix.engine import Engine, Prefill
from graftjax.prefix.errors import LogError, PrefixError, PromptTooLongError, SpanMismatchError

__all__ = [
  'Engine',
  'LogError',
  'Prefill',
  'PrefixError',
  'PromptTooLongError',
  'SpanMismatchError',
]
