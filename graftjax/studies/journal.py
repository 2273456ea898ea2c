"""A run's journal: finished steps appended to a JSONL file, so a restarted run skips them.

    journal = Journal(path, config={'model': ..., 'items': [...]})
    record = journal.step('recurrence/gsm8k/test/3', lambda: answer(...))

The first line holds the SHA-256 of the run's `config`; a journal written
under another config is refused, never mixed in. Each later line is one
finished step `{"step": name, "value": ...}`, flushed and fsynced before
`step` returns, so an interrupted run loses at most the step in flight (a
torn last line is dropped on reopening).
"""

from __future__ import annotations

from collections.abc import Callable
import json
import os
import pathlib
from typing import Any

from graftjax import ledger


class JournalError(ValueError):
  """The journal was written by a run of another config."""


class Journal:
  """Steps of one run, by name; with `path=None` nothing is written to disk."""

  def __init__(self, path: str | os.PathLike[str] | None, *, config: dict[str, Any]):
    self.path = None if path is None else pathlib.Path(path)
    self.config_sha256 = ledger.sha256_bytes(json.dumps(config, sort_keys=True).encode())
    self.done: dict[str, Any] = {}
    self.resumed = 0
    if self.path is None:
      return
    if self.path.exists() and self.path.stat().st_size:
      lines = self.path.read_bytes().split(b'\n')
      header = json.loads(lines[0])
      if header.get('config_sha256') != self.config_sha256:
        raise JournalError(
          f'{self.path} was written by a run of config {header.get("config_sha256")},'
          f' this run is {self.config_sha256}: use another journal path'
        )
      for line in lines[1:]:
        try:
          entry = json.loads(line)
        except ValueError:  # the torn last line of an interrupted write
          continue
        self.done[entry['step']] = entry['value']
      self.resumed = len(self.done)
      self._rewrite()  # drops a torn line before anything is appended
    else:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self._append({'config_sha256': self.config_sha256}, mode='w')

  def step(self, name: str, compute: Callable[[], Any]) -> Any:
    """The journaled value of step `name`, else `compute()` journaled (JSON-ready)."""
    if name in self.done:
      return self.done[name]
    value = compute()
    value = json.loads(json.dumps(value))  # what a resumed run will read back
    self.done[name] = value
    if self.path is not None:
      self._append({'step': name, 'value': value})
    return value

  def _rewrite(self) -> None:
    lines = [{'config_sha256': self.config_sha256}]
    lines += [{'step': k, 'value': v} for k, v in self.done.items()]
    partial = self.path.with_suffix('.partial')
    partial.write_text(''.join(json.dumps(line) + '\n' for line in lines))
    partial.replace(self.path)

  def _append(self, line: dict[str, Any], mode: str = 'a') -> None:
    with self.path.open(mode) as f:
      f.write(json.dumps(line) + '\n')
      f.flush()
      os.fsync(f.fileno())
