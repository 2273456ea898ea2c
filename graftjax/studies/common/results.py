"""The header every experiment result starts with, and writing the result.

    result = results.header('exactness', inputs={'model_fingerprint': ...})
    result.update(summary=...)
    results.write(_OUT.value, result, outputs=[table_path])

`header` records the command line, the pinned determinism configuration
(`determinism.record()`: XLA flags, jax/jaxlib/numpy/python versions, device,
CPU kind, source digest) and the digests of the inputs; `write` adds the
digests of any side files (a table, a plot) and writes the self-digested
JSON (`ledger.write_result`), then says where.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
import os
import pathlib
import shlex
import sys
from typing import Any

from graftjax import determinism
from graftjax import ledger


def command_line(argv: Iterable[str] | None = None) -> str:
  """The command that ran this process, as a shell line ('python script.py --flag=...')."""
  return shlex.join(['python', *(sys.argv if argv is None else argv)])


def shown_command(command: str, committed: str) -> str:
  """`command` as a page shows it: `--out` names the committed file `committed`, and any other
  absolute path (of the machine that ran it) is shown as `<path>/` and its last part."""
  try:
    words = shlex.split(command)
  except ValueError:
    return command
  shown = []
  for word in words:
    flag, eq, value = word.partition('=')
    if eq and flag == '--out':
      word = f'--out={committed}'
    elif eq and value.startswith('/'):
      word = f'{flag}=<path>/{pathlib.PurePosixPath(value).name}'
    elif word.startswith('/'):
      word = f'<path>/{pathlib.PurePosixPath(word).name}'
    shown.append(word)
  return ' '.join(shown)


def model_inputs(model, model_name: str) -> dict[str, Any]:
  """What a result records of its model: the fingerprint, the weights' digest (of a
  checkpoint, the float32 tensors it holds), the tokenizer's digest (of a checkpoint's
  tokenizer.json or tokenizer.model, the file; None for a model without one) and, for the
  real gemma3-270m, its GGUF's SHA-256."""
  inputs = {
    'model_fingerprint': model.fingerprint,
    'params_sha256': model.params_digest,
    'tokenizer_sha256': model.tokenizer.digest() if model.tokenizer is not None else None,
  }
  if model_name == 'gemma3-270m':
    from graftjax.models.gemma import gguf  # pylint: disable=g-import-not-at-top

    inputs['gguf_sha256'] = gguf.expected_sha256()
  return inputs


def header(
  experiment: str, *, inputs: Mapping[str, Any] | None = None, command: str | None = None
) -> dict[str, Any]:
  """`experiment`, `command`, `determinism` and `inputs`: the first keys of every result.

  Args:
    experiment: the experiment's name (its script's stem).
    inputs: digests and names of what the run read (model fingerprint, token
      ids, fixtures, ...).
    command: the command line (default: this process's, `command_line()`).
  """
  return {
    'experiment': experiment,
    'command': command_line() if command is None else command,
    'determinism': determinism.record(),
    'inputs': dict(inputs or {}),
  }


def write(
  path: str | os.PathLike,
  result: Mapping[str, Any],
  *,
  outputs: Iterable[str | os.PathLike] = (),
  log: Callable[[str], None] | None = print,
) -> str:
  """Writes `result` as self-digested JSON; returns its digest.

  Args:
    path: the result file.
    result: the JSON-ready result, usually starting from `header(...)`.
    outputs: files written beside it (written before this call); their
      SHA-256 is recorded under `outputs`, keyed by path.
    log: called with 'wrote PATH (sha256 ...)' (None: silent).
  """
  body = dict(result)
  outputs = [pathlib.Path(p) for p in outputs]
  if outputs:
    body['outputs'] = {str(p): ledger.sha256_file(p) for p in outputs}
  digest = ledger.write_result(path, body)
  if log:
    log(f'wrote {path} (sha256 {digest})')
  return digest
