"""`run(main)`: absl's `app.run` for the experiments, with quiet library logs.

absl's `app.run` raises the logging verbosity to INFO when `--verbosity` is
not given, so every library's INFO records (orbax saving or restoring the
params cache, jax probing for backends) reach stderr. Here the default stays
WARNING: the user sees progress bars, the result and where it was written;
`--verbosity=0` (INFO) or higher still shows everything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from absl import app
from absl import flags
from absl import logging


def _warning_unless_asked() -> None:
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)


def run(main: Callable[[Sequence[str]], Any]) -> None:
  """Parses flags and calls `main(argv)`, logging at WARNING unless --verbosity says otherwise."""
  app.call_after_init(_warning_unless_asked)
  app.run(main)
