"""A run's journal: finished steps appended to a JSONL file, so a restarted run skips them.

    journal = Journal(path, config={'model': ..., 'items': [...]})
    record = journal.step('recurrence/gsm8k/test/3', lambda: answer(...), check=still_holds)

The first line holds the SHA-256 of the run's `config`; a journal written
under another config is refused, never mixed in. Each later line is one
finished step `{"step": name, "value": ..., "prev": ..., "sha256": ...}`,
flushed and fsynced before `step` returns. `sha256` is the digest of the
line's own step, value and `prev`, and `prev` is the previous line's
`sha256` (the header's for the first step), so an edited, reordered or
duplicated line breaks the chain at that line.

Each line is written at the end of the last complete one, and the file is cut
there: a write that fails half-way (a full disk) raises `JournalError`, leaves
the step undone (it runs again) and is overwritten by the next append, so the
journal resumes with every step finished before it. On reopening, a last line
without its newline is an interrupted write: it is dropped (and cut from the
file) and its step runs again. Anything else
wrong (a line that is not JSON, not UTF-8, of the wrong shape, whose digest
or chain does not hold, a step twice) raises `JournalError` naming the file,
the line and the cause. A step read back is passed to its `check` before it
is used, so a value that names something outside the journal (a block in a
store) is checked against it first.

One run writes a journal at a time: an open journal holds an exclusive lock
(`flock`) on `<path>.lock` until it is closed (`close`, `with`, or its process
ends), and a second one opened on the same path meanwhile, in this process or
another, raises `JournalError` naming the holder (pid, host, since when).
"""

from __future__ import annotations

from collections.abc import Callable
import contextlib
import datetime
import fcntl
import hashlib
import json
import math
import os
import pathlib
import socket
from typing import Any, Self

from graftjax.errors import GraftjaxError

FORMAT = 2  # the header's 'journal' field: lines carry their digest and chain
_HEADER = {'journal', 'config_sha256', 'sha256'}
_STEP = {'step', 'value', 'prev', 'sha256'}


class JournalError(GraftjaxError, ValueError):
  """A journal cannot be resumed: another config, a damaged line, or a step that no longer holds."""


def _canonical(data: Any) -> bytes:
  return json.dumps(
    data, sort_keys=True, separators=(',', ':'), ensure_ascii=True, allow_nan=False
  ).encode()


def _digest(data: dict[str, Any]) -> str:
  return hashlib.sha256(_canonical(data)).hexdigest()


def _no_constant(name: str) -> Any:
  raise ValueError(f'{name} is not a JSON number')


def _finite(text: str) -> float:
  if not math.isfinite(value := float(text)):
    raise ValueError(f'{text[:20]} is beyond a float')
  return value


def _parse(line: bytes) -> Any:
  """The JSON of one line; ValueError naming the cause."""
  try:
    text = line.decode('utf-8')
  except UnicodeDecodeError as e:
    raise ValueError(f'not UTF-8 ({e.reason} at byte {e.start})') from None
  try:
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
  except RecursionError:
    raise ValueError('JSON nested too deeply') from None
  except ValueError as e:
    raise ValueError(f'not JSON ({e})') from None


def _lock(path: pathlib.Path) -> Any:
  """The open lock file `<path>.lock`, locked exclusively for this writer and naming it.

  Raises:
    JournalError: another writer holds it (named by the pid, host and time it wrote there).
  """
  where = path.with_name(path.name + '.lock')
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    file = open(where, 'a+b')  # noqa: SIM115 - held open (and locked) until `close`
  except OSError as e:
    raise JournalError(f'{path}: cannot open its lock {where}: {e}') from e
  try:
    fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    file.seek(0)
    holder = file.read(400).decode(errors='replace').strip() or 'a writer that has not said who'
    file.close()
    raise JournalError(
      f'{path} is being written by another run ({holder}; lock {where}): one run writes a'
      ' journal at a time: wait for it to end, or give this run another journal path'
    ) from e
  holder = f'pid {os.getpid()} on host {socket.gethostname()} since'
  holder += f' {datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}'
  file.truncate(0)
  file.write(holder.encode() + b'\n')
  file.flush()
  return file


class Journal:
  """Steps of one run, by name; with `path=None` nothing is written to disk.

  Raises:
    JournalError: another run holds the journal open, or it cannot be resumed (see above).
  """

  def __init__(self, path: str | os.PathLike[str] | None, *, config: dict[str, Any]):
    self.path = None if path is None else pathlib.Path(path)
    self._closed = False
    self._held = None if self.path is None else _lock(self.path)
    try:
      self._load(config)
    except BaseException:
      self.close()
      raise

  def close(self) -> None:
    """Releases the journal's lock (another run may then open it); later steps are refused."""
    if self._held is not None:
      self._held.close()
      self._closed = True

  def __enter__(self) -> Self:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _load(self, config: dict[str, Any]) -> None:
    self.config_sha256 = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    self.done: dict[str, Any] = {}
    self.resumed = 0
    self._line: dict[str, int] = {}  # step read back -> its line number, until checked
    self._last = ''
    self._size = 0  # bytes of the file up to the end of its last complete line
    if self.path is None:
      return
    try:
      data = self.path.read_bytes() if self.path.exists() else b''
    except OSError as e:
      raise JournalError(f'{self.path}: cannot be read: {e}') from e
    kept = data[: data.rfind(b'\n') + 1]  # an unterminated last line is a torn write
    if kept:
      self._read(kept.split(b'\n')[:-1])
      self.resumed = len(self.done)
      self._size = len(kept)
      if len(kept) < len(data):
        self._append(b'')
    else:
      header = {'journal': FORMAT, 'config_sha256': self.config_sha256}
      try:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
      except OSError as e:
        raise JournalError(f'{self.path}: cannot be written: {e}') from e
      last = _digest(header)
      self._append(_canonical({**header, 'sha256': last}) + b'\n')
      self._last = last

  def step(
    self,
    name: str,
    compute: Callable[[], Any],
    *,
    check: Callable[[Any], str | None] | None = None,
  ) -> Any:
    """The journaled value of step `name`, else `compute()` journaled (JSON-ready).

    Args:
      name: the step's name, unique in the run.
      compute: computes the value when the journal has none.
      check: called once with a value read back from the file, before it is
        returned; returns None if the value still holds, else why not
        (raised as `JournalError` naming the file, line and step).
    """
    if name in self.done:
      if name in self._line:
        line = self._line.pop(name)
        if check is not None and (cause := check(self.done[name])):
          raise JournalError(f'{self.path} line {line}: step {name!r} {cause}')
      return self.done[name]
    if self._closed:
      raise JournalError(f'{self.path}: closed; open it again to run step {name!r}')
    value = compute()
    entry = {'step': name, 'value': value, 'prev': self._last}
    try:
      data = _canonical(entry)
    except (TypeError, ValueError) as e:
      raise JournalError(f'step {name!r}: the value is not JSON-ready: {e}') from e
    value = json.loads(data)['value']  # what a resumed run will read back
    if self.path is not None:
      digest = hashlib.sha256(data).hexdigest()
      self._append(_canonical({**entry, 'sha256': digest}) + b'\n')
      self._last = digest
    self.done[name] = value
    return value

  def _read(self, lines: list[bytes]) -> None:
    """Checks every complete line and keeps its step; raises at the first bad one."""
    for number, line in enumerate(lines, start=1):
      try:
        entry = _parse(line)
      except ValueError as e:
        raise JournalError(f'{self.path} line {number}: {e}') from None
      if number == 1:
        self._header(entry)
      else:
        self._entry(number, entry)

  def _header(self, entry: Any) -> None:
    where = f'{self.path} line 1'
    if not isinstance(entry, dict) or 'config_sha256' not in entry:
      raise JournalError(f'{where}: not a journal header')
    if entry.get('journal') != FORMAT or set(entry) != _HEADER:
      raise JournalError(
        f'{where}: a journal of format {entry.get("journal")!r}, this code writes {FORMAT}'
        ' (lines with digests): use another journal path'
      )
    body = {k: v for k, v in entry.items() if k != 'sha256'}
    if entry['sha256'] != _digest(body):
      raise JournalError(f'{where}: the header does not match its digest (edited)')
    if entry['config_sha256'] != self.config_sha256:
      raise JournalError(
        f'{self.path} was written by a run of config {entry["config_sha256"]},'
        f' this run is {self.config_sha256}: use another journal path'
      )
    self._last = entry['sha256']

  def _entry(self, number: int, entry: Any) -> None:
    where = f'{self.path} line {number}'
    if not isinstance(entry, dict) or set(entry) != _STEP:
      fields = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
      raise JournalError(f'{where}: not a step line (has {fields}, needs {sorted(_STEP)})')
    name = entry['step']
    if not isinstance(name, str):
      raise JournalError(f'{where}: the step name is {type(name).__name__}, not a string')
    if entry['sha256'] != _digest({k: v for k, v in entry.items() if k != 'sha256'}):
      raise JournalError(f'{where}: step {name!r} does not match its digest (edited)')
    if entry['prev'] != self._last:
      raise JournalError(
        f'{where}: step {name!r} follows {entry["prev"]!r}, not the line before it'
        f' ({self._last}): lines reordered, duplicated or removed'
      )
    if name in self.done:
      raise JournalError(f'{where}: step {name!r} twice (first at line {self._line[name]})')
    self.done[name] = entry['value']
    self._line[name] = number
    self._last = entry['sha256']

  def _append(self, data: bytes) -> None:
    """Writes `data` after the last complete line and cuts the file there; on a failure,
    cuts the file back to its last complete line (or leaves the next append to).

    Raises:
      JournalError: the write failed; the journal holds the steps it held before.
    """
    try:
      with self.path.open('r+b') as f:
        f.seek(self._size)
        f.write(data)
        f.truncate()
        f.flush()
        os.fsync(f.fileno())
    except OSError as e:
      with contextlib.suppress(OSError):  # else the next append writes over what is left
        os.truncate(self.path, self._size)
      raise JournalError(
        f'{self.path}: cannot be written: {e}; the journal keeps its {len(self.done)} finished'
        ' steps, and the step runs again'
      ) from e
    self._size += len(data)
