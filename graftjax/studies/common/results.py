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
import re
import shlex
import sys
from typing import Any

from graftjax import determinism
from graftjax import ledger


def command_line(argv: Iterable[str] | None = None) -> str:
  """The command that ran this process, as a shell line ('python script.py --flag=...')."""
  return shlex.join(['python', *(sys.argv if argv is None else argv)])


# An absolute path (`/<dir>/out`), a home one (`~/x`) or one under a variable (`$OUT/x`), not part
# of a longer path, a URL, a fraction (`1/57`) or a placeholder (`<path>/x`).
_MACHINE_PATH = re.compile(
  r'(?<![\w.<>:/~$}])(?:/|~/|\$\{?[A-Za-z_]\w*\}?/)[\w.~-][^\s`\'")\]|,;]*'
)


def _machine(value: str) -> bool:
  return bool(_MACHINE_PATH.fullmatch(value))


def shown_command(command: str, committed: str, files: Mapping[str, str] | None = None) -> str:
  """`command` as a page shows it, with committed paths, never the paths of the machine that ran.

  `--out` names the committed file `committed`; any other path (a word, a flag's value or one of
  its comma-separated parts) whose last part is a name in `files` ({file name: committed path})
  is shown as that committed path; any other machine path (absolute, `~/` or `$VAR/`) as
  `<path>/` and its last part.
  """
  try:
    words = shlex.split(command)
  except ValueError:
    return command
  files = files or {}

  def shown(path: str) -> str:
    name = pathlib.PurePosixPath(path).name
    if '/' in path and name in files:
      return files[name]
    return f'<path>/{name}' if _machine(path) else path

  out = []
  for word in words:
    flag, eq, value = word.partition('=')
    if eq and flag == '--out' and committed:
      word = f'--out={committed}'
    elif eq and (flag.startswith('-') or flag.isidentifier()):  # a flag or VAR=value
      word = f'{flag}={",".join(shown(v) for v in value.split(","))}'
    else:
      word = ','.join(shown(v) for v in word.split(','))
    out.append(word if '<path>/' in word else shlex.quote(word))
  return ' '.join(out)


def machine_paths(text: str) -> list[str]:
  """The paths of a machine in `text` (absolute, `~/...`, `$VAR/...`), in order of appearance;
  a page shows committed paths (relative to the repository) and `<path>/name` instead."""
  return _MACHINE_PATH.findall(text)


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
    from graftjax.models.gemma import gguf

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
