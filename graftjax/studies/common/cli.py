"""`run(main)`: absl's `app.run` for the experiments, with quiet library logs.

absl's `app.run` raises the logging verbosity to INFO when `--verbosity` is
not given, so every library's INFO records (orbax saving or restoring the
params cache, jax probing for backends) reach stderr. Here the default stays
WARNING, for loggers that set a level of their own too (bm25s logs at DEBUG
whatever the verbosity): the user sees progress bars, the result and where it was written;
`--verbosity=0` (INFO) or higher still shows everything.
"""

from __future__ import annotations

import logging as std_logging
from collections.abc import Callable, Sequence
from typing import Any

from absl import app
from absl import flags
from absl import logging


def _warning_unless_asked() -> None:
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
    # A library that sets its own logger's level (bm25s: DEBUG) bypasses the verbosity;
    # the handler's level holds for every logger.
    logging.get_absl_handler().setLevel(std_logging.WARNING)  # absl's WARNING is -1


def run(main: Callable[[Sequence[str]], Any]) -> None:
  """Parses flags and calls `main(argv)`, logging at WARNING unless --verbosity says otherwise."""
  app.call_after_init(_warning_unless_asked)
  app.run(main)
