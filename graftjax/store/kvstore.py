"""The tensorstore kvstore under a store: opened from a path, URL or spec; read, written."""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

import tensorstore as ts

from graftjax.errors import GraftjaxError
from graftjax.store import errors as store_errors
from graftjax.store import manifest as store_manifest

# What a store on `file` keeps beside its blocks (`commit.STAGING` and its lock).
_STORE_ENTRIES = ('.lock', '.tmp')
_STORE_FOLDERS = ('.tmp', '.quarantine')  # what the store writes there is its own

# tensorstore's absl status codes and messages, by the errno they mean here.
_TS_ERRNO = (
  ('No space left', errno.ENOSPC),
  ('RESOURCE_EXHAUSTED', errno.ENOSPC),
  ('Read-only file system', errno.EROFS),
  ('PERMISSION_DENIED', errno.EACCES),
  ('NOT_FOUND', errno.ENOENT),
)
# An object store's answers that name the bucket or the credentials, not a key.
_NO_BUCKET = ('NoSuchBucket', 'bucket does not exist', 'Bucket not found')
_DENIED = ('UNAUTHENTICATED', 'InvalidAccessKeyId', 'SignatureDoesNotMatch', 'AccessDenied')

# Seconds a request may take before the store gives up on it (a server that stopped
# answering); each chunk of a block is one request.
TIMEOUT_SECONDS = 120.0
# Retries of a request that failed transiently (unreachable, 500, 503, 429) on `s3` and
# `gcs`, unless the spec's context sets its own: about 6 s in all, not tensorstore's
# default of 32 attempts backing off to 32 s each.
RETRIES = {'max_retries': 5, 'initial_delay': '0.2s', 'max_delay': '2s'}
_RETRIED_DRIVERS = ('s3', 'gcs')
# Requests in flight at once on `s3` and `gcs` (tensorstore's `s3_request_concurrency` and
# `gcs_request_concurrency` context resources), unless the store, its spec or tensorstore's
# variable (`TENSORSTORE_S3_REQUEST_CONCURRENCY`, `..._GCS_...`) sets its own: tensorstore's
# own default, set in the spec so that the store can say what is in force. A block's chunks
# are read with every request issued at once; this bounds how many the driver keeps on the wire.
CONCURRENCY = 32


class DeniedError(GraftjaxError, PermissionError):
  """The server refused the credentials (or their rights) for a request."""

  denied = True  # `store_errors.io_errors` raises AccessDeniedError for it


def open_kvstore(
  root: Any, read_only: bool, concurrency: int | None = None
) -> tuple[ts.KvStore, str | None]:
  """The store's kvstore (its path ending in '/'), and its directory on `file`.

  `concurrency`, if given, is the most requests in flight at once on `s3` and `gcs`
  (over what the spec says); else the spec's own, else `CONCURRENCY`.
  """
  if concurrency is not None and (
    isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
  ):
    raise store_errors.StoreIOError(
      store_errors.short(root), f'concurrency must be a positive int, got {concurrency!r}'
    )
  if isinstance(root, os.PathLike):
    root = os.fspath(root)
  if isinstance(root, (str, bytes)) and '://' not in str(root):
    spec = {'driver': 'file', 'path': local_path(root)}
  elif isinstance(root, str) and root.startswith('file://'):
    spec = {'driver': 'file', 'path': local_path(root.removeprefix('file://'))}
  elif (
    isinstance(root, dict) and root.get('driver') == 'file' and isinstance(root.get('path'), str)
  ):
    spec = {**root, 'path': local_path(root['path'])}
  elif isinstance(root, ts.KvStore):
    if concurrency is not None:
      raise store_errors.StoreIOError(
        location(root), "an open kvstore's concurrency is its context's; set it there"
      )
    spec = root.spec(retain_context=True)
  else:
    spec = _with_concurrency(_with_retries(root), concurrency)
  try:
    kv = root.copy() if isinstance(root, ts.KvStore) else ts.KvStore.open(spec).result()
  except ValueError as e:
    if 'not a registered KvStore driver' in str(e) or 'unsupported URL scheme' in str(e):
      driver = spec.get('driver') if isinstance(spec, dict) else str(spec).split('://')[0]
      raise store_errors.UnknownDriverError(
        store_errors.short(spec), f'unknown tensorstore kvstore driver {driver!r} ({e})'
      ) from e
    raise store_errors.StoreIOError(
      store_errors.short(spec), f'cannot open the kvstore: {e}'
    ) from e
  except TypeError as e:
    raise store_errors.StoreIOError(
      store_errors.short(spec), f'not a kvstore spec, URL or path: {e}'
    ) from e
  if kv.spec().to_json().get('driver') != 'file':
    if kv.path and not kv.path.endswith('/'):
      kv.path += '/'
    return kv, None
  local = os.path.abspath(kv.path or '.')
  _check_not_in_a_block(local)
  if not read_only and not os.path.lexists(local):
    with store_errors.io_errors(local, 'cannot create the store'):
      os.makedirs(local, exist_ok=True)
  try:
    mode = os.stat(local).st_mode
  except FileNotFoundError:
    raise store_errors.StoreIOError(
      local, 'no such store (read-only stores are not created)'
    ) from None
  except OSError as e:
    raise store_errors.StoreIOError(local, f'cannot open the store: {e.strerror}') from e
  if not stat.S_ISDIR(mode):
    raise store_errors.StoreIOError(local, 'the store root is not a directory')
  kv.path = local + '/'
  return kv, local


def _with_retries(spec: Any) -> Any:
  """`spec` (a dict or URL) with `RETRIES` in its context, for `s3` and `gcs` specs that set none."""
  if isinstance(spec, str) and spec.split('://')[0] in ('s3', 'gs'):
    try:
      spec = ts.KvStore.Spec(spec).to_json()
    except ValueError:
      return spec
  if not isinstance(spec, dict) or spec.get('driver') not in _RETRIED_DRIVERS:
    return spec
  context = spec.get('context', {})
  resource = f'{spec["driver"]}_request_retries'
  if not isinstance(context, dict) or resource in context or resource in spec:
    return spec
  return {**spec, 'context': {**context, resource: RETRIES}}


def _with_concurrency(spec: Any, concurrency: int | None) -> Any:
  """`spec` (an `s3` or `gcs` dict; anything else as it is) with `<driver>_request_concurrency`:
  `concurrency` over the spec's own; else, where it sets none, tensorstore's variable's or
  `CONCURRENCY` in its context."""
  if not isinstance(spec, dict) or spec.get('driver') not in _RETRIED_DRIVERS:
    return spec
  resource = f'{spec["driver"]}_request_concurrency'
  if concurrency is not None:
    return {**spec, resource: {'limit': concurrency}}
  context = spec.get('context', {})
  if not isinstance(context, dict) or resource in context or resource in spec:
    return spec
  variable = os.environ.get(f'TENSORSTORE_{resource.upper()}', '')
  limit = int(variable) if variable.isdigit() and int(variable) > 0 else CONCURRENCY
  return {**spec, 'context': {**context, resource: {'limit': limit}}}


def request_concurrency(kv: ts.KvStore) -> int | None:
  """The most requests `kv` keeps in flight at once (its driver's `_request_concurrency`
  limit); None on a driver without one (`file`, `memory`) or where tensorstore's own
  default applies."""
  spec = kv.spec(retain_context=True).to_json()
  resource = f'{spec.get("driver")}_request_concurrency'
  found = spec.get(resource)
  if not isinstance(found, dict):
    found = spec.get('context', {}).get(resource)
  limit = found.get('limit') if isinstance(found, dict) else None
  return limit if isinstance(limit, int) else None


def location(kv: ts.KvStore) -> str:
  """Where `kv` is, for messages: its URL, or `driver://bucket/path` for a spec with no
  URL form (an `s3` store on a named endpoint). Never credentials."""
  try:
    return kv.url
  except NotImplementedError:
    spec = kv.spec().to_json()
    return f'{spec.get("driver")}://{spec.get("bucket", "")}/{kv.path}'


def local_path(path: Any) -> str:
  """`path` as tensorstore's `file` driver takes it: absolute and normalised (`.`, `..` and
  `//` resolved as `os.path.abspath` does, without following symlinks).

  Raises:
    UnsafePathError: for a backslash, which the driver takes for a separator (`a\\b`
      would name `a/b`): refused rather than written elsewhere than asked.
  """
  if not isinstance(path, str):
    raise store_errors.StoreIOError(store_errors.short(path), 'a store path must be a str')
  if '\\' in path:
    raise store_errors.UnsafePathError(
      path,
      'a backslash in a store path: the file kvstore takes it for a separator and would'
      ' write elsewhere than asked; refusing it',
    )
  return os.path.abspath(path)


def _check_not_in_a_block(local: str) -> None:
  """Raises UnsafePathError if `local` is, or lies inside, a block folder or the staging or
  quarantine folder of a store.

  A block folder is named as a block key (staged or set aside: the key and a suffix) and
  holds a `manifest.json`, or lies directly in a store (beside its `.lock` or `.tmp/`): a
  store there would mix its files with the block's, or take the folder of a block
  deposited later. What lies in `.tmp/` is removed by the store's `gc`.
  """
  path = local
  while True:
    parent = os.path.dirname(path)
    name = os.path.basename(path)
    in_a_store = any(os.path.lexists(os.path.join(parent, entry)) for entry in _STORE_ENTRIES)
    if store_manifest.HEX64.fullmatch(name.split('.')[0]) and (
      in_a_store or os.path.isfile(os.path.join(path, store_manifest.MANIFEST))
    ):
      raise store_errors.UnsafePathError(
        local, f'{path} is a block folder of a store; a store cannot be made in it'
      )
    if name in _STORE_FOLDERS and in_a_store:
      raise store_errors.UnsafePathError(
        local, f'{path} is the {name} folder of a store; a store cannot be made in it'
      )
    if parent == path:
      return
    path = parent


def result(future: Any, *, writing: bool = False) -> Any:
  """`future.result()`, tensorstore's errors (ValueError) raised as OSError.

  A missing bucket is ENXIO (not ENOENT: no key of it is missing; a write,
  `writing`, that finds nothing found no bucket), refused credentials
  `DeniedError`, no answer within `TIMEOUT_SECONDS` ETIMEDOUT.
  """
  try:
    return future.result(timeout=TIMEOUT_SECONDS)
  except TimeoutError as e:
    future.cancel()
    raise OSError(errno.ETIMEDOUT, f'no answer within {TIMEOUT_SECONDS:g} s') from e
  except ValueError as e:
    text = str(e)
    if any(marker in text for marker in _NO_BUCKET) or (writing and 'NOT_FOUND' in text):
      raise OSError(errno.ENXIO, f'no such bucket: {text}') from e
    if any(marker in text for marker in _DENIED) or (
      'PERMISSION_DENIED' in text and 'http_response_code' in text
    ):
      raise DeniedError(errno.EACCES, f'access denied (credentials or their rights): {text}') from e
    code = next((c for marker, c in _TS_ERRNO if marker in text), errno.EIO)
    raise OSError(code, text) from e


def write_files(kv: ts.KvStore, files: dict[str, bytes]) -> None:
  """Writes every value at once (tensorstore overlaps them); waits for all."""
  futures = [kv.write(name, data) for name, data in files.items()]
  for future in futures:
    result(future, writing=True)


def read_value(kv: ts.KvStore, name: str) -> bytes:
  """The value under `name`; FileNotFoundError if there is none."""
  return value(kv.read(name), name)


def value(read: Any, name: str) -> bytes:
  """The value a kvstore read found; FileNotFoundError if it found none."""
  found = result(read)
  if found.state != 'value':
    raise FileNotFoundError(errno.ENOENT, 'vanished', name)
  return found.value
