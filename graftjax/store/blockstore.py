"""Block store: KV blocks on a tensorstore kvstore, content-addressed, verified, atomic.

`BlockStore(root)` keeps each `KVBlock` under its content key (`key_for`).
`put` deposits a block so that it appears whole or not at all; `get` and
`verify` check every byte against its digest (BLAKE3) as it is read. Every failure
raises a `StoreError` naming the path and the cause. The on-disk format,
and what each guarantee rests on, is specified in docs/store_format.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from graftjax import blocks
from graftjax.store import commit as store_commit
from graftjax.store import encode as store_encode
from graftjax.store import errors as store_errors
from graftjax.store import kvstore as store_kvstore
from graftjax.store import manifest as store_manifest
from graftjax.store import pages as store_pages
from graftjax.store import read as store_read
from graftjax.store import values as store_values

# How to free a key that a wrong or damaged block holds.
_RECOVER = (
  'To recover: `verify(key)` the stored block, `quarantine(key)` it if it is the wrong one'
  ' (it is moved aside, not deleted), then `put` the right block again'
)


class BlockStore:
  """KV blocks under `root`, one key prefix (a directory on `file`) per block.

  `root` is a local directory (the `file` kvstore), a tensorstore kvstore
  URL or JSON spec (`'memory://'`, `{'driver': 'gcs', 'bucket': ...}`), or
  an open `tensorstore.KvStore`. Opening a store writes nothing. With
  `read_only=True`, or on storage that refuses writes, `list`, `get` and
  `verify` work and `put`, `delete` and `gc` raise `store_errors.ReadOnlyStoreError`.
  `concurrency` bounds the requests in flight at once on `s3` and `gcs`
  (`store_kvstore.open_kvstore`); `self.concurrency` is the bound in force (None on `file`).
  """

  def __init__(self, root: Any, *, read_only: bool = False, concurrency: int | None = None):
    self.read_only = read_only
    self._kv, self._local = store_kvstore.open_kvstore(root, read_only, concurrency)
    self.concurrency = store_kvstore.request_concurrency(self._kv)
    self.root = self._local if self._local is not None else store_kvstore.location(self._kv)
    if self._local is not None:
      self._staging = store_commit.Staging(self._local)

  def put(
    self, block: blocks.KVBlock, *, page_layout: Sequence[Sequence[int]] | None = None
  ) -> str:
    """Stores `block` and returns its key; a no-op if already stored.

    With `page_layout` (one `(first_row, stop_row)` per layer, rows of the
    block's n) only those rows are stored, as a page under its own key
    (`key_for(meta, page_layout)`): each layer keeps either all rows
    `(0, n)` or the same last r rows `(n - r, n)`, 0 <= r < n, at least one
    layer of each kind. `get` gives the other rows back as zeros. The plain
    block format (no `page_layout`) is unchanged.

    Raises:
      InvalidBlockError: if the block cannot be stored exactly (dtype, empty
        block, positions outside int32, metadata of the wrong types) or is not
        what its key says (rows other than its token ids, positions other than
        its metadata's, a NaN or infinity in k or v).
      ConflictingBlockError: if its key is stored with another payload (naming both
        payloads' digests), also when another writer's deposit of the key commits first.
      CorruptBlockError: if its key is stored but does not verify.
      (Both name the way out: `verify`, `quarantine`, `put` again.)
      UnsupportedFormatError: if its key is stored in another format.
      ReadOnlyStoreError, StoreIOError, UnsafePathError: if the storage
        refuses the deposit, or (object stores) it did not keep the manifest, or the
        deposit took longer than half the grace of a garbage collection in progress;
        nothing of it is visible then.
    """
    self._check_writable()
    if self._local is not None:
      files, manifest = store_encode.block_files(block, self.root, page_layout)
    else:  # format 5: the payload under a prefix of this deposit's own
      files, manifest = store_encode.block_files(
        block, self.root, page_layout, store_manifest.PREFIXED_FORMAT, store_manifest.new_data_id()
      )
    key = manifest['key']
    for _ in range(3):  # a block deleted under us is deposited again
      if self._exists(key):
        try:
          self._check_stored(key, manifest, block, page_layout)
          return key
        except store_errors.MissingBlockError:
          continue
      if self._local is not None:
        deposited = store_commit.deposit_local(self._staging, self._kv, key, files)
      else:
        manifest = {**manifest, 'data': store_manifest.new_data_id()}  # one prefix a try
        payload = {name: b for name, b in files.items() if name != store_manifest.MANIFEST}
        deposited = store_commit.deposit_kvstore(
          self._kv,
          self._where(key),
          key,
          payload,
          store_encode.manifest_bytes(manifest),
          manifest['data'],
        )
      if deposited:
        return key
    raise store_errors.StoreIOError(
      self._where(key),
      'deleted by another writer each time it was deposited, or the server did not keep its'
      ' manifest: it was not in place when read back after its write',
    )

  def get(self, key: str, *, into: store_read.Into | None = None) -> blocks.KVBlock:
    """The block stored under `key`, after verifying every digest.

    Args:
      key: its key.
      into: where to read it: `into(meta, shapes)` returns writable arrays
        by name ('k', 'v' [L, n, K, H], each layer C-contiguous;
        'positions' [n] int32), e.g. views of reused staging buffers
        (`graftjax.restore.Staging`). New arrays if None.
    Returns:
      A KVBlock of numpy arrays: k, v [L, n, K, H] and positions [n] int32.
      For a page, the rows it does not keep are zeros (see `get_page`).
    Raises:
      InvalidKeyError, MissingBlockError, CorruptBlockError,
      UnsupportedFormatError, UnsafePathError, StoreIOError.
    """
    return self._read(self._checked_key(key), into)[1]

  def get_page(
    self,
    key: str,
    *,
    into: store_read.Into | None = None,
    on_verified: store_read.OnVerified | None = None,
  ) -> tuple[blocks.KVBlock, tuple[tuple[int, int], ...] | None]:
    """(block, page_layout) under `key`: as `get`, with the rows each layer keeps.

    page_layout is None for a plain block (every row of every layer).
    `on_verified(name, stop)`, if given, is called on this thread as the
    layers [0, stop) of an array (stop None: all of it) have landed and
    verified, before the block as a whole is checked (`store_read.OnVerified`):
    a restore copies layers to the device while later ones are still read.
    """
    manifest, block = self._read(self._checked_key(key), into, on_verified)
    return block, store_pages.layout_of(manifest)

  def read_meta(self, key: str) -> tuple[blocks.BlockMeta, tuple[tuple[int, int], ...] | None]:
    """(metadata, page_layout) of the block under `key`, from its manifest alone: one read.

    The manifest is checked as `get` checks it (every field, that it describes `key`, and
    against its own chunk digests); no array is read (`verify` reads them). On an object
    store the manifest is the commit point, so a block whose manifest reads is complete.

    Raises:
      InvalidKeyError, MissingBlockError, CorruptBlockError (naming the key and the block
      the manifest describes), UnsupportedFormatError, StoreIOError.
    """
    where = self._where(self._checked_key(key))
    name = f'{key}/{store_manifest.MANIFEST}'
    try:
      with store_errors.io_errors(where, f'cannot read {store_manifest.MANIFEST}'):
        if self._local is None:
          data = store_kvstore.read_value(self._kv, name)
        else:
          fd = os.open(os.path.join(self._local, name), os.O_RDONLY | os.O_NOFOLLOW)
          with open(fd, 'rb', buffering=0) as f:
            data = f.readall()
    except store_errors.StoreIOError as e:
      if isinstance(e.__cause__, FileNotFoundError):
        raise store_errors.MissingBlockError(where, 'no such block') from None
      raise
    manifest, meta = store_manifest.parse_manifest(data, where, key)
    return meta, store_pages.layout_of(manifest)

  def verify(self, key: str) -> None:
    """Raises unless the block under `key` matches its manifest exactly and holds
    what `put` takes: its positions what its metadata says, k and v finite.

    Raises:
      InvalidKeyError, MissingBlockError, CorruptBlockError,
      UnsupportedFormatError, UnsafePathError, StoreIOError.
    """
    _, block = self._read(self._checked_key(key))
    nonfinite = store_values.first_nonfinite(block.arrays())
    if nonfinite is not None:
      raise store_errors.CorruptBlockError(
        self._where(key), f'{nonfinite}: a stored block holds finite keys and values only'
      )

  def quarantine(self, key: str) -> str:
    """Moves the block under `key` aside, undamaged and unread, and returns where it went.

    The way out of a key taken by a wrong block (one stored before `put` checked what it
    now checks, or damaged since): `verify` it, `quarantine` it, `put` the right block.
    On `file` it goes to `.quarantine/<key>.<id>/` in the store (never listed, never
    collected by `gc`); on other drivers it is copied under that prefix, then deleted.

    Raises:
      InvalidKeyError, MissingBlockError, UnsafePathError, ReadOnlyStoreError,
      StoreIOError; ReplacedBlockError (another store's): the block was deleted and put
      again while it was set aside, and the new one is left in place.
    """
    self._checked_key(key)
    self._check_writable()
    if self._local is None:
      return store_commit.quarantine_kvstore(self._kv, self._where(key), key)
    return store_commit.quarantine_local(self._staging, self._where(key), key)

  def list(self) -> list[str]:
    """Sorted keys of the complete blocks (not verified; see `verify`)."""
    is_key = store_manifest.HEX64.fullmatch
    if self._local is not None:
      with store_errors.io_errors(self.root, 'cannot list the store'):
        names = os.listdir(self._local)
      return sorted(n for n in names if is_key(n) and self._is_complete(n))
    with store_errors.io_errors(self.root, 'cannot list the store'):
      names = store_kvstore.result(self._kv.list())
    suffix = f'/{store_manifest.MANIFEST}'.encode()
    return sorted(
      n[:64].decode()
      for n in names
      if n.endswith(suffix) and is_key(n[: -len(suffix)].decode('latin-1'))
    )

  def delete(self, key: str) -> None:
    """Removes the block under `key`; it vanishes from view at once.

    On an object store only the block read here is removed: its manifest at the
    generation read, then the payload it named.

    Raises:
      InvalidKeyError, MissingBlockError, UnsafePathError, ReadOnlyStoreError,
      StoreIOError; ReplacedBlockError: the block was deleted and put again by another
      writer meanwhile, and the new one is left in place.
    """
    self._checked_key(key)
    self._check_writable()
    if self._local is None:
      store_commit.delete_kvstore(self._kv, self._where(key), key)
    else:
      store_commit.delete_local(self._staging, self._where(key), key)

  def gc(self, *, grace_seconds: float = store_commit.GRACE_SECONDS) -> int:
    """Removes what deposits and deletions that failed or died left; returns how many.

    On `file`: everything in `.tmp/`, after waiting for the deposits and deletions in
    progress. On other kvstores: the writers' prefixes (`<key>/<data>/`) that no manifest
    names, that are older than `grace_seconds` and that no deposit is committing; while it
    runs, deposits commit only prefixes younger than half its grace (docs/store_format.md).

    Raises:
      InvalidArgumentError: `grace_seconds` is not a number >= 0 (NaN, negative, a str).
      ReadOnlyStoreError, StoreIOError.
    """
    grace_seconds = store_commit.checked_grace(self.root, grace_seconds)
    self._check_writable()
    if self._local is None:
      return store_commit.collect_kvstore(self._kv, self.root, grace_seconds)
    return self._staging.collect()

  def __contains__(self, key: str) -> bool:
    key = self._checked_key(key)
    if self._local is not None:
      return self._is_complete(key)
    if self._exists(key):
      return True
    with store_errors.io_errors(self._where(key), 'cannot read the block'):
      # A missing bucket answers a GET as a missing key, a listing as what it is.
      store_kvstore.result((self._kv / f'{key}/').list())
    return False

  def _checked_key(self, key: str) -> str:
    if not isinstance(key, str) or not store_manifest.HEX64.fullmatch(key):
      raise store_errors.InvalidKeyError(
        self.root, f'invalid block key {key!r}: expected 64 lowercase hex digits'
      )
    return key

  def _where(self, key: str) -> str:
    """The block's path (file) or URL, for messages."""
    return os.path.join(self.root, key) if self._local is not None else f'{self.root}{key}'

  def _exists(self, key: str) -> bool:
    """Whether `key` is taken: its folder (file), its manifest (one GET elsewhere)."""
    if self._local is not None:
      return os.path.lexists(os.path.join(self._local, key))
    with store_errors.io_errors(self._where(key), 'cannot read the block'):
      manifest = store_kvstore.result(self._kv.read(f'{key}/{store_manifest.MANIFEST}'))
    return manifest.state == 'value'

  def _is_complete(self, key: str) -> bool:
    path = os.path.join(self._local, key)
    manifest = os.path.join(path, store_manifest.MANIFEST)
    return (
      not os.path.islink(path)
      and os.path.isdir(path)
      and not os.path.islink(manifest)
      and os.path.isfile(manifest)
    )

  def _read(
    self,
    key: str,
    into: store_read.Into | None = None,
    on_verified: store_read.OnVerified | None = None,
  ):
    """(manifest, block) of `key`, read and verified."""
    local = None if self._local is None else os.path.join(self._local, key)
    return store_read.read_block(
      self._kv / f'{key}/', self._where(key), key, local, into, on_verified
    )

  def _check_writable(self) -> None:
    if self.read_only:
      raise store_errors.ReadOnlyStoreError(self.root, 'the store was opened read-only')

  def _check_stored(
    self,
    key: str,
    manifest: dict[str, Any],
    block: blocks.KVBlock,
    page_layout: Sequence[Sequence[int]] | None,
  ) -> None:
    try:
      stored, _ = self._read(key)
    except store_errors.CorruptBlockError as e:
      raise store_errors.CorruptBlockError(e.path, f'{e.cause}. {_RECOVER}') from e
    hashes = store_manifest.DIGEST_OF_FORMAT
    if hashes[stored['format']] != hashes[manifest['format']]:  # an older format's digests
      _, manifest = store_encode.block_files(block, self.root, page_layout, stored['format'])
    # Formats 3, 4 and 5 of one payload differ only in `format` and 5's `data` (its prefix).
    payload = lambda m: {name: value for name, value in m.items() if name not in ('format', 'data')}
    differences = store_manifest.differences(payload(stored), payload(manifest))
    if differences:
      raise store_errors.ConflictingBlockError(
        self._where(key),
        f'the block is already stored with another payload (stored'
        f' {store_manifest.payload_digest(stored)} != new'
        f' {store_manifest.payload_digest(manifest)}): {"; ".join(differences)}. {_RECOVER}',
      )
