"""Deposits and deletions that take effect at once: a block is whole or absent.

On the `file` kvstore a block is written under `.tmp/`, verified and
renamed into place; on other drivers its manifest, written last, is
written only if absent. docs/store_format.md says what each rests on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import uuid
from collections.abc import Iterator

import tensorstore as ts

from graftjax.store import errors as store_errors
from graftjax.store import files as store_files
from graftjax.store import kvstore as store_kvstore
from graftjax.store import manifest as store_manifest
from graftjax.store import read as store_read

STAGING = '.tmp'
QUARANTINE = '.quarantine'  # blocks set aside by `BlockStore.quarantine`, kept for inspection
_LOCK = '.lock'
# Times a deposit on an object store writes its payload again over another writer's.
_REPAIRS = 3


class Staging:
  """`.tmp/` of a store on the `file` kvstore, and the `.lock` that guards it.

  Every deposit and deletion holds the lock (shared) while it has a
  directory under `.tmp/`, so whoever holds it alone may remove them all.
  """

  def __init__(self, root: str):
    self.root = root
    self.dir = os.path.join(root, STAGING)

  @contextlib.contextmanager
  def shared(self) -> Iterator[None]:
    """Shares the store lock; first clears `.tmp/` if no one else holds it."""
    with self._lock(None) as lock:
      try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        pass
      else:
        self._clear()
      fcntl.flock(lock, fcntl.LOCK_SH)
      yield

  def collect(self) -> int:
    """Waits for deposits and deletions in progress, then clears `.tmp/`; how many."""
    with self._lock(fcntl.LOCK_EX):
      return self._clear()

  @contextlib.contextmanager
  def _lock(self, operation: int | None) -> Iterator[int]:
    """Opens `.lock` (flocked with `operation` if given) and `.tmp/`."""
    path = os.path.join(self.root, _LOCK)
    with store_errors.io_errors(path, 'cannot open the store lock'):
      try:
        lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
      except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
          raise store_errors.UnsafePathError(path, 'the store lock is not a regular file') from e
        raise
    try:
      if not stat.S_ISREG(os.fstat(lock).st_mode):
        raise store_errors.UnsafePathError(path, 'the store lock is not a regular file')
      with store_errors.io_errors(self.dir, 'cannot create the staging directory'):
        try:
          os.mkdir(self.dir)
        except FileExistsError:
          pass
      mode = os.lstat(self.dir).st_mode
      if not stat.S_ISDIR(mode):
        kind = 'a symlink' if stat.S_ISLNK(mode) else 'not a directory'
        raise store_errors.UnsafePathError(self.dir, f'the staging directory is {kind}')
      if operation is not None:
        fcntl.flock(lock, operation)
      yield lock
    finally:
      os.close(lock)

  def _clear(self) -> int:
    with store_errors.io_errors(self.dir, 'cannot clear the staging directory'):
      names = os.listdir(self.dir)
      for name in names:
        path = os.path.join(self.dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
          shutil.rmtree(path)
        else:
          os.unlink(path)
    return len(names)


def deposit_local(
  staging: Staging, kv: ts.KvStore, key: str, files: dict[str, bytes | memoryview]
) -> bool:
  """Writes the block under .tmp/, verifies it, renames it into place.

  Returns False if another writer's block took the key first.
  """
  final = os.path.join(staging.root, key)
  with staging.shared():
    name = f'{key}.{uuid.uuid4().hex}'
    staged = os.path.join(staging.dir, name)
    try:
      with store_errors.io_errors(staged, 'cannot deposit the block'):
        os.mkdir(staged)
        store_kvstore.write_files(kv / f'{STAGING}/{name}/', files)
        store_files.fsync_directories(staged)
      store_read.read_block(kv / f'{STAGING}/{name}/', staged, key, staged)
      with store_errors.io_errors(final, 'cannot publish the block'):
        published = store_files.rename_unless_taken(staged, final)
        if published:
          store_files.fsync(staging.root)
    finally:
      shutil.rmtree(staged, ignore_errors=True)
  return published


def deposit_kvstore(
  kv: ts.KvStore, where: str, key: str, files: dict[str, bytes | memoryview]
) -> bool:
  """Writes the payload under `key/`, then the manifest if still absent: the commit point.

  The manifest write is conditional on the manifest not existing (a
  generation condition), so of racing writers one publishes where the
  server honours the condition. The block is then read back and verified:
  if another writer's payload landed over ours (a rival whose manifest lost,
  or a server that ignores the condition), the owner of the stored manifest
  writes its payload again, at most `_REPAIRS` times.
  Returns False if another writer's manifest is the one stored.
  """
  manifest = store_manifest.MANIFEST
  block_kv = kv / f'{key}/'
  payload = {name: data for name, data in files.items() if name != manifest}
  with store_errors.io_errors(where, 'cannot deposit the block'):
    absent = store_kvstore.result(block_kv.read(manifest))
    if absent.state != 'missing':
      return False
    # A failed deposit leaves payload without a manifest: never listed or
    # read, and overwritten by the next deposit of the key.
    store_kvstore.write_files(block_kv, payload)
    stamp = store_kvstore.result(
      block_kv.write(manifest, files[manifest], if_equal=absent.stamp.generation), writing=True
    )
  if not stamp.generation:  # the condition failed: another manifest is there
    return False
  for _ in range(_REPAIRS):
    try:
      store_read.read_block(block_kv, where, key, None)
      return True
    except store_errors.CorruptBlockError:
      with store_errors.io_errors(where, 'cannot deposit the block'):
        stored = store_kvstore.result(block_kv.read(manifest))
        if stored.state != 'value' or stored.value != bytes(files[manifest]):
          return False  # deleted, or another writer's manifest replaced ours: the caller looks
        store_kvstore.write_files(block_kv, payload)
  store_read.read_block(block_kv, where, key, None)
  return True


def delete_local(staging: Staging, where: str, key: str) -> None:
  """Renames the block at `where` into `.tmp/` (gone from view), then removes it."""
  with staging.shared():
    if os.path.islink(where):
      raise store_errors.UnsafePathError(where, 'the block is a symlink; refusing it')
    trash = os.path.join(staging.dir, f'{key}.{uuid.uuid4().hex}.del')
    with store_errors.io_errors(where, 'cannot delete the block'):
      try:
        os.rename(where, trash)
      except FileNotFoundError:
        raise store_errors.MissingBlockError(where, 'no such block') from None
      store_files.fsync(staging.root)
      shutil.rmtree(trash)


def delete_kvstore(kv: ts.KvStore, where: str, key: str) -> None:
  """Deletes the manifest first (the block is gone from view), then the payload."""
  manifest = f'{key}/{store_manifest.MANIFEST}'
  with store_errors.io_errors(where, 'cannot delete the block'):
    if store_kvstore.result(kv.read(manifest)).state != 'value':
      raise store_errors.MissingBlockError(where, 'no such block')
    store_kvstore.result(kv.write(manifest, None))
    store_kvstore.result(kv.delete_range(ts.KvStore.KeyRange(f'{key}/', f'{key}0')))


def quarantine_local(staging: Staging, where: str, key: str) -> str:
  """Renames the block at `where` (whatever it holds) to `.quarantine/<key>.<id>`; returns
  that path. The key is then free: a later deposit stores a block there anew."""
  folder = os.path.join(staging.root, QUARANTINE)
  with staging.shared(), store_errors.io_errors(where, 'cannot quarantine the block'):
    if not os.path.lexists(where):
      raise store_errors.MissingBlockError(where, 'no such block')
    try:
      os.mkdir(folder)
    except FileExistsError:
      pass
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
      raise store_errors.UnsafePathError(folder, 'the quarantine is not a directory')
    target = os.path.join(folder, f'{key}.{uuid.uuid4().hex}')
    os.rename(where, target)  # a symlink is moved as itself, never followed
    store_files.fsync(folder)
    store_files.fsync(staging.root)
  return target


def quarantine_kvstore(kv: ts.KvStore, where: str, key: str) -> str:
  """Copies the block's values to `.quarantine/<key>.<id>/`, then deletes it (manifest
  first, as `delete_kvstore`); returns the copy's prefix."""
  target = f'{QUARANTINE}/{key}.{uuid.uuid4().hex}/'
  block_kv = kv / f'{key}/'
  with store_errors.io_errors(where, 'cannot quarantine the block'):
    if store_kvstore.result(block_kv.read(store_manifest.MANIFEST)).state != 'value':
      raise store_errors.MissingBlockError(where, 'no such block')
    names = [name.decode('latin-1') for name in store_kvstore.result(block_kv.list())]
    reads = [block_kv.read(name) for name in names]
    copies = {name: store_kvstore.value(read, name) for name, read in zip(names, reads)}
    store_kvstore.write_files(kv / target, copies)
  delete_kvstore(kv, where, key)
  return f'{store_kvstore.location(kv)}{target}'
