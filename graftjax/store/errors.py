"""What the block store raises: `StoreError`, naming the path and the cause."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from typing import Any

from graftjax.errors import GraftjaxError


class StoreError(GraftjaxError):
  """A block cannot be stored or read back as asked.

  Attributes:
    path: what failed: the store, a block in it, or a file of a block.
    cause: why, in words.
  """

  def __init__(self, path: str, cause: str):
    super().__init__(path, cause)  # both survive pickling across processes
    self.path = path
    self.cause = cause

  def __str__(self) -> str:
    return f'{self.path}: {self.cause}'


class InvalidKeyError(StoreError):
  """A key is not 64 lowercase hex digits (and so could name any path)."""


class InvalidBlockError(StoreError):
  """`put` refuses a block: its metadata or arrays cannot be stored exactly."""


class MissingBlockError(StoreError):
  """No block is stored under a key (or it was deleted while being read)."""


class CorruptBlockError(StoreError):
  """A stored block does not match its manifest, or its manifest is malformed."""


class UnsupportedFormatError(StoreError):
  """A stored block is in an on-disk format this code does not read."""


class ConflictingBlockError(StoreError):
  """A key is already stored with a different payload."""


class ReplacedBlockError(StoreError):
  """A block was deleted and put again by another writer while a deletion of it ran: the
  deletion removed nothing, and the new block stays."""


class UnsafePathError(StoreError):
  """A symlink, or an entry of the wrong kind, where the store expects its own."""


class StoreIOError(StoreError):
  """The storage under the store failed: not a directory, disk full, I/O error."""


class ReadOnlyStoreError(StoreIOError):
  """A write to a store opened read-only, or on storage that refuses writes."""


class AccessDeniedError(StoreIOError):
  """An object store refused the credentials, or their rights, for a request."""


class InvalidArgumentError(StoreError, ValueError):
  """A store call was given an argument it does not take (named with its value)."""


class UnknownDriverError(StoreError):
  """The store names a tensorstore kvstore driver that does not exist here."""


class MalformedError(GraftjaxError, ValueError):
  """A manifest (or a block's metadata) is not what the format allows.

  Internal: callers turn it into InvalidBlockError or CorruptBlockError.
  """


@contextlib.contextmanager
def io_errors(path: str, doing: str) -> Iterator[None]:
  """Turns an OSError into a StoreIOError (or ReadOnlyStoreError) on `path`."""
  try:
    yield
  except OSError as e:
    where = e.filename if isinstance(e.filename, str) else path
    cause = f'{doing}: {e.strerror or e}'
    if getattr(e, 'denied', False):
      raise AccessDeniedError(where, cause) from e
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
      raise ReadOnlyStoreError(where, cause) from e
    raise StoreIOError(where, cause) from e


def short(value: Any) -> str:
  """repr of `value` cut to 80 characters (a bad field can be huge)."""
  try:
    text = repr(value)
  except (ValueError, RecursionError):  # ints past str's digit limit; deep nesting
    return f'a {type(value).__name__}'
  return text if len(text) <= 80 else f'{text[:77]}...'
