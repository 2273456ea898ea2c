"""Deposits and deletions that take effect at once: a block is whole or absent.

On the `file` kvstore a block is written under `.tmp/`, verified and
renamed into place. On other drivers each writer stages its payload under
a prefix of its own, `<key>/<data>/`, announces that it is about to commit it
(`<key>/<data>/.commit`), checks the grace of every garbage collection in
progress (`.gc/`), reads the payload back, and commits it by writing
`<key>/manifest.json` (which names the prefix) only if absent; a deletion
removes the manifest only at the generation it read, then the prefix that
manifest named. No writer ever writes or deletes bytes another manifest
names, and `collect_kvstore` never deletes a prefix a writer may still
commit. docs/store_format.md says what each rests on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import numbers
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from typing import Any

import tensorstore as ts

from graftjax.store import errors as store_errors
from graftjax.store import files as store_files
from graftjax.store import kvstore as store_kvstore
from graftjax.store import manifest as store_manifest
from graftjax.store import read as store_read

STAGING = '.tmp'
QUARANTINE = '.quarantine'  # blocks set aside by `BlockStore.quarantine`, kept for inspection
_LOCK = '.lock'
# Seconds after which `collect_kvstore` may remove a writer's prefix that no manifest names,
# unless asked for another grace. A deposit commits only a prefix younger than half the
# shortest grace in force (this, or that of a collection in progress: `GC_RECORDS`); clocks
# of the machines sharing a store may differ by less than that.
GRACE_SECONDS = 3600.0
# On an object store, each garbage collection in progress: `.gc/<data id>` (when it began)
# holding {"grace_seconds": g}, written before it lists the store, deleted when it ends.
GC_RECORDS = '.gc/'
# `<key>/<data>/.commit`: a deposit is about to commit its prefix `<key>/<data>/`, written
# before it reads `GC_RECORDS`; a collection that lists it leaves that prefix alone (unless
# it is older than `GRACE_SECONDS`: a writer that died).
INTENT = '.commit'


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
  kv: ts.KvStore,
  where: str,
  key: str,
  payload: dict[str, bytes | memoryview],
  manifest: bytes,
  data: str,
) -> bool:
  """Stages `payload` under `<key>/<data>/`, then commits it (`announce`, a read back whole
  through `get`'s checks against `manifest`, `commit`): `manifest` (which names `data`)
  lands at `<key>/manifest.json` only if none is there.

  Returns True if this manifest was written and reads back, False if another writer's was
  there first (the caller compares payloads) or none is there after the write (the caller
  deposits again). A payload not committed is deleted (what a crash leaves,
  `collect_kvstore` removes); if the manifest's write fails without an answer, the payload
  and its announcement are left (the write may land yet), and `collect_kvstore` keeps them
  until the announcement is older than `GRACE_SECONDS`.

  Raises:
    StoreIOError: the payload staged does not read back whole and exact (a server that
      acknowledged a write it did not keep), or is older than half the grace in force;
      nothing is committed then.
  """
  block_kv = kv / f'{key}/'
  outcome = 'lost'  # 'committed', or 'unknown' while the manifest's write has not answered
  try:
    with store_errors.io_errors(where, 'cannot deposit the block'):
      absent = store_kvstore.result(block_kv.read(store_manifest.MANIFEST))
      if absent.state != 'missing':
        return False
      store_kvstore.write_files(kv / f'{key}/{data}/', payload)
    announce(kv, where, key, data)
    try:
      store_read.read_block(block_kv, where, key, None, staged=manifest)
    except (store_errors.CorruptBlockError, store_errors.MissingBlockError) as e:
      raise store_errors.StoreIOError(
        where,
        f'the payload written under {data}/ does not read back ({e.cause}): the server'
        ' acknowledged a write it did not keep, or garbage collection took it; nothing was'
        ' committed',
      ) from e
    except store_errors.StoreIOError as e:
      raise type(e)(e.path, f'cannot deposit the block: {e.cause}') from e
    outcome = 'unknown'
    committed = commit(kv, where, key, data, manifest, absent.stamp.generation)
    outcome = 'committed' if committed else 'lost'
    return committed
  finally:
    if outcome == 'lost':
      discard(kv, key, data)


def announce(kv: ts.KvStore, where: str, key: str, data: str) -> None:
  """Writes `<key>/<data>/.commit`, then checks that the prefix is younger than half the
  grace in force (`grace_in_force`): from here until `commit` removes the announcement, no
  `collect_kvstore` takes the prefix (docs/store_format.md says why).

  Raises:
    StoreIOError: the prefix is older than that; nothing may be committed.
  """
  with store_errors.io_errors(where, 'cannot deposit the block'):
    store_kvstore.result(kv.write(f'{key}/{data}/{INTENT}', b''), writing=True)
    grace = grace_in_force(kv)
  age = time.time() - data_seconds(data)
  if age > grace / 2:
    raise store_errors.StoreIOError(
      where,
      f'staging the payload took {age:.0f} s, more than half the {grace:.0f} s garbage'
      ' collection grants it; nothing was committed',
    )


def commit(kv: ts.KvStore, where: str, key: str, data: str, manifest: bytes, absent: Any) -> bool:
  """Writes `manifest` (naming `data`) to `<key>/manifest.json` if it is still at the
  generation `absent` (the "no value" one read before staging), reads it back, and removes
  the announcement. True if it is this manifest, now in place; False if another writer's
  was there first or none is there (the server acknowledged a write it did not keep, or a
  deletion took the block at once). A condition that failed is checked against the stored
  manifest: a write whose answer was lost and that was retried finds its own first try
  there (the manifest names this deposit's prefix, so equal bytes are this deposit's).

  Raises:
    StoreIOError: a request failed; the manifest's write may land yet.
  """
  block_kv = kv / f'{key}/'
  with store_errors.io_errors(where, 'cannot deposit the block'):
    store_kvstore.result(
      block_kv.write(store_manifest.MANIFEST, manifest, if_equal=absent), writing=True
    )
    stored = store_kvstore.result(block_kv.read(store_manifest.MANIFEST))
  if not (stored.state == 'value' and stored.value == manifest):
    return False
  try:  # the block is committed; an announcement left over only delays nothing
    store_kvstore.result(kv.delete_range(_exactly(f'{key}/{data}/{INTENT}')))
  except OSError:
    pass
  return True


def discard(kv: ts.KvStore, key: str, data: str) -> None:
  """Deletes a deposit's prefix (its announcement with it) unless the manifest names it;
  a failure leaves it to `collect_kvstore`."""
  try:
    stored = store_kvstore.result(kv.read(f'{key}/{store_manifest.MANIFEST}'))
    if stored.state == 'value' and f'{data}/' in _payload_prefixes(stored.value):
      return
    store_kvstore.result(kv.delete_range(_range(f'{key}/{data}/')))
  except OSError:
    pass


def grace_in_force(kv: ts.KvStore) -> float:
  """The grace a deposit must keep to: `GRACE_SECONDS`, or the shortest of the collections
  in progress (`GC_RECORDS` younger than `GRACE_SECONDS`; a record that does not parse
  counts as 0). Run under `io_errors`."""
  records = kv / GC_RECORDS
  now = time.time()
  grace = GRACE_SECONDS
  for name in store_kvstore.result(records.list()):
    text = name.decode('latin-1')
    if not store_manifest.DATA_ID.fullmatch(text) or now - data_seconds(text) > GRACE_SECONDS:
      continue
    found = store_kvstore.result(records.read(name))
    if found.state == 'value':
      grace = min(grace, _recorded_grace(found.value))
  return grace


def _recorded_grace(value: bytes) -> float:
  try:
    grace = json.loads(value)['grace_seconds']
  except (ValueError, KeyError, TypeError):
    return 0.0
  return float(grace) if isinstance(grace, (int, float)) and grace >= 0 else 0.0


def checked_grace(where: str, grace_seconds: Any) -> float:
  """`grace_seconds` as a float: a real number >= 0 (inf: collect nothing).

  Raises:
    InvalidArgumentError: anything else (a str, None, a bool, NaN, a negative number).
  """
  if (
    isinstance(grace_seconds, bool)
    or not isinstance(grace_seconds, numbers.Real)
    or math.isnan(grace_seconds)
    or grace_seconds < 0
  ):
    raise store_errors.InvalidArgumentError(
      where,
      f'grace_seconds must be a number of seconds >= 0 (inf collects nothing), got'
      f' {store_errors.short(grace_seconds)}',
    )
  return float(grace_seconds)


def data_seconds(data: str) -> int:
  """The second a writer's prefix (`store_manifest.DATA_ID`) was made."""
  return int(data.split('-')[0])


def _delete_quietly(kv: ts.KvStore, prefix: str) -> None:
  """Deletes everything under `prefix`; a failure leaves it to `collect_kvstore`."""
  try:
    store_kvstore.result(kv.delete_range(_range(prefix)))
  except OSError:
    pass


def _range(prefix: str) -> ts.KvStore.KeyRange:
  """Every key under `prefix` (which ends in '/')."""
  return ts.KvStore.KeyRange(prefix, prefix[:-1] + '0')


def _exactly(name: str) -> ts.KvStore.KeyRange:
  """The one key `name` (a deletion that finds nothing is no error)."""
  return ts.KvStore.KeyRange(name, name + '\0')


def _payload_prefixes(manifest: bytes) -> list[str]:
  """Where the payload a manifest's bytes commit lies, relative to its block: its writer's
  prefix in format 5; else (an older format, or a manifest that does not parse) each array's
  folder beside it. Never another writer's prefix."""
  try:
    data = json.loads(manifest).get('data')
  except (ValueError, AttributeError):
    data = None
  if isinstance(data, str) and store_manifest.DATA_ID.fullmatch(data):
    return [f'{data}/']
  return [f'{name}/' for name in store_manifest.PAGE_ARRAY_NAMES]


def _remove(kv: ts.KvStore, where: str, key: str, found) -> None:
  """Deletes `<key>/manifest.json` if it is still at the generation of `found` (a read of
  it), then the payload it named. If the manifest is gone meanwhile (another deletion, or
  this one's request retried after its answer was lost), that payload is deleted all the
  same: no later deposit writes under its prefix. Run under `io_errors`.

  Raises:
    ReplacedBlockError: it was deleted and put again meanwhile (left in place).
  """
  block_kv = kv / f'{key}/'
  stamp = store_kvstore.result(
    block_kv.write(store_manifest.MANIFEST, None, if_equal=found.stamp.generation)
  )
  if not stamp.generation:
    now = store_kvstore.result(block_kv.read(store_manifest.MANIFEST))
    if now.state == 'value':
      raise store_errors.ReplacedBlockError(
        where,
        'the block was deleted and put again by another writer while this deletion ran;'
        ' nothing was deleted, and the new block stays',
      )
  for prefix in _payload_prefixes(found.value):
    store_kvstore.result(block_kv.delete_range(_range(prefix)))


def collect_kvstore(kv: ts.KvStore, where: str, grace_seconds: float = GRACE_SECONDS) -> int:
  """Removes writers' prefixes (`<key>/<data>/`) that no manifest names, that are older
  than `grace_seconds` and that no deposit has announced it is committing (`announce`):
  payloads of deposits that lost, failed or died, and of deletions that died before
  removing them. Returns how many.

  It records its grace under `GC_RECORDS` before it lists the store (a deposit keeps to the
  shortest recorded), and removes the record when done. An announcement or a record older
  than `GRACE_SECONDS` is one a writer or collection left as it died: removed with its
  prefix.
  """
  record = f'{GC_RECORDS}{store_manifest.new_data_id()}'
  with store_errors.io_errors(where, 'cannot collect the store'):
    now = time.time()  # before the record: a deposit that reads it reads a later clock
    body = json.dumps({'grace_seconds': grace_seconds}).encode()
    store_kvstore.result(kv.write(record, body), writing=True)
    try:
      return _collect(kv, now, grace_seconds, record)
    finally:
      store_kvstore.result(kv.delete_range(_exactly(record)))


def _collect(kv: ts.KvStore, now: float, grace_seconds: float, record: str) -> int:
  """`collect_kvstore`'s work once its record is written; run under `io_errors`."""
  found, announced, stale = set(), set(), []
  for name in store_kvstore.result(kv.list()):
    text = name.decode('latin-1')
    parts = text.split('/')
    if text.startswith(GC_RECORDS):
      dead = store_manifest.DATA_ID.fullmatch(parts[-1]) and (
        now - data_seconds(parts[-1]) > GRACE_SECONDS
      )
      if dead and text != record:
        stale.append(text)
    elif (
      len(parts) > 2
      and store_manifest.HEX64.fullmatch(parts[0])
      and store_manifest.DATA_ID.fullmatch(parts[1])
    ):
      found.add((parts[0], parts[1]))
      if parts[2:] == [INTENT] and now - data_seconds(parts[1]) <= GRACE_SECONDS:
        announced.add((parts[0], parts[1]))
  collected = 0
  for key, data in sorted(found - announced):
    if now - data_seconds(data) <= grace_seconds:
      continue
    manifest = store_kvstore.result(kv.read(f'{key}/{store_manifest.MANIFEST}'))
    if manifest.state == 'value' and f'{data}/' in _payload_prefixes(manifest.value):
      continue
    store_kvstore.result(kv.delete_range(_range(f'{key}/{data}/')))
    collected += 1
  for name in stale:
    store_kvstore.result(kv.delete_range(_exactly(name)))
  return collected


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
  """Deletes the manifest at the generation read (the block is gone from view), then the
  payload it named (`_remove`)."""
  with store_errors.io_errors(where, 'cannot delete the block'):
    found = store_kvstore.result(kv.read(f'{key}/{store_manifest.MANIFEST}'))
    if found.state != 'value':
      raise store_errors.MissingBlockError(where, 'no such block')
    _remove(kv, where, key, found)


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
  """Copies the block's manifest and the payload it names to `.quarantine/<key>.<id>/`,
  then deletes it as `delete_kvstore` does, at the generation it copied; returns the copy's
  prefix. If the block was replaced meanwhile, the copy is removed and the error raised
  (`_remove`); if it was deleted meanwhile, the copy is kept (it is the block as it was)."""
  target = f'{QUARANTINE}/{key}.{uuid.uuid4().hex}/'
  block_kv = kv / f'{key}/'
  with store_errors.io_errors(where, 'cannot quarantine the block'):
    found = store_kvstore.result(block_kv.read(store_manifest.MANIFEST))
    if found.state != 'value':
      raise store_errors.MissingBlockError(where, 'no such block')
    names = [
      prefix + name.decode('latin-1')
      for prefix in _payload_prefixes(found.value)
      for name in store_kvstore.result((block_kv / prefix).list())
    ]
    reads = [block_kv.read(name) for name in names]
    copies = {name: store_kvstore.value(read, name) for name, read in zip(names, reads)}
    copies[store_manifest.MANIFEST] = found.value
    store_kvstore.write_files(kv / target, copies)
    try:
      _remove(kv, where, key, found)
    except store_errors.ReplacedBlockError:
      _delete_quietly(kv, target)
      raise
  return f'{store_kvstore.location(kv)}{target}'
