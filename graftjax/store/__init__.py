"""Block store: KV blocks on a tensorstore kvstore, content-addressed, verified, atomic.

`BlockStore` (blockstore.py) and the names below are the store's API; each
module holds one part of it (docs/store_format.md lists them).
"""

from graftjax.store import errors as _errors
from graftjax.store import files as _files
from graftjax.store import manifest as _manifest
from graftjax.store.blockstore import BlockStore

ARRAY_NAMES = _manifest.ARRAY_NAMES
FORMAT = _manifest.FORMAT
PREFIXED_FORMAT = _manifest.PREFIXED_FORMAT
KEY_SCHEME = _manifest.KEY_SCHEME
KV_DTYPES = _manifest.KV_DTYPES
MANIFEST = _manifest.MANIFEST
PAGE_ARRAY_NAMES = _manifest.PAGE_ARRAY_NAMES
array_digest = _manifest.array_digest
digest_tree = _files.digest_tree
key_for = _manifest.key_for
StoreError = _errors.StoreError
AccessDeniedError = _errors.AccessDeniedError
ConflictingBlockError = _errors.ConflictingBlockError
CorruptBlockError = _errors.CorruptBlockError
InvalidBlockError = _errors.InvalidBlockError
InvalidArgumentError = _errors.InvalidArgumentError
InvalidKeyError = _errors.InvalidKeyError
MissingBlockError = _errors.MissingBlockError
ReadOnlyStoreError = _errors.ReadOnlyStoreError
ReplacedBlockError = _errors.ReplacedBlockError
StoreIOError = _errors.StoreIOError
UnknownDriverError = _errors.UnknownDriverError
UnsafePathError = _errors.UnsafePathError
UnsupportedFormatError = _errors.UnsupportedFormatError

__all__ = [
  'ARRAY_NAMES',
  'FORMAT',
  'KEY_SCHEME',
  'KV_DTYPES',
  'MANIFEST',
  'PAGE_ARRAY_NAMES',
  'PREFIXED_FORMAT',
  'AccessDeniedError',
  'BlockStore',
  'ConflictingBlockError',
  'CorruptBlockError',
  'InvalidBlockError',
  'InvalidArgumentError',
  'InvalidKeyError',
  'MissingBlockError',
  'ReadOnlyStoreError',
  'ReplacedBlockError',
  'StoreError',
  'StoreIOError',
  'UnknownDriverError',
  'UnsafePathError',
  'UnsupportedFormatError',
  'array_digest',
  'digest_tree',
  'key_for',
]
