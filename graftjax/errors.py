"""`GraftjaxError`: the root of every error graftjax raises.

Each project error also subclasses the builtin it resembles (a bad argument is a
`ValueError`, a failed sandbox a `RuntimeError`), so callers may catch either the
builtin or, in one clause, everything the project raises:

    try:
      store.get(key)
    except GraftjaxError as e:
      ...

This module imports nothing: every layer (kernels, models, the method, the studies)
may derive from it.
"""


class GraftjaxError(Exception):
  """An error raised by graftjax; its message names the cause."""
