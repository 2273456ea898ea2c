"""A block's manifest.json: its key, metadata and array digests, and its one check.

docs/store_format.md specifies every field.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import hashlib
import json
import math
import re
import threading
import time
import types
import typing
import uuid
from collections.abc import Sequence
from typing import Any

import blake3
import numpy as np

from graftjax import blocks
from graftjax.errors import GraftjaxError
from graftjax.store import chunks as store_chunks
from graftjax.store import errors as store_errors
from graftjax.store import pages as store_pages

FORMAT = 'graftjax.blockstore/4'
# Format 4 with its payload under a prefix of its writer's own, `<key>/<data>/`, which the
# manifest names (`data`): what a deposit on an object store writes (docs/store_format.md).
PREFIXED_FORMAT = 'graftjax.blockstore/5'
# Each format this code reads, and the hash its digests use: blocks of formats 2, 3 are still read.
DIGEST_OF_FORMAT = {
  'graftjax.blockstore/2': 'sha256',
  'graftjax.blockstore/3': 'blake3',
  FORMAT: 'blake3',
  PREFIXED_FORMAT: 'blake3',
}
# What separates the parts of a chunk's key: format 4 keeps an array's chunks in one folder.
_SEPARATOR_OF_FORMAT = {
  'graftjax.blockstore/2': '/',
  'graftjax.blockstore/3': '/',
  FORMAT: '.',
  PREFIXED_FORMAT: '.',
}
# A writer's own prefix: the second it began (10 decimal digits, so that garbage collection
# can tell an old one from one in progress), '-', 32 random hex digits.
DATA_ID = re.compile(r'[0-9]{10}-[0-9a-f]{32}')
_HASHES = {'sha256': hashlib.sha256, 'blake3': blake3.blake3}
KEY_SCHEME = 'graftjax.block-key/3'
MANIFEST = 'manifest.json'
ARRAY_NAMES = ('k', 'v', 'positions')
# A page's arrays (see `BlockStore.put`'s page_layout): k, v hold the layers
# kept whole, k_tail, v_tail the last rows of the trimmed layers.
PAGE_ARRAY_NAMES = ('k', 'v', 'k_tail', 'v_tail', 'positions')
KV_DTYPES = ('float32', 'bfloat16')
HEX64 = re.compile(r'[0-9a-f]{64}')  # keys (SHA-256) and digests (BLAKE3 or SHA-256): 32 bytes

_MANIFEST_FIELDS = {'format', 'key', 'layout_version', 'meta', 'arrays'}
_UNSUPPORTED_LAYOUT = getattr(blocks, 'UnsupportedLayoutError', ())


class OtherFormatError(GraftjaxError):
  """A manifest names another format (or its metadata another layout)."""


def key_for(meta: blocks.BlockMeta, page_layout: Sequence[Sequence[int]] | None = None) -> str:
  """The content key of a block: SHA-256 hex of its canonical identity.

  The identity is every field of `BlockMeta` (token ids as a list; a field at
  its `blocks.UNRECORDED` value is left out, as in `to_json`), plus
  `key_scheme` and `stop`, and for a page its `page_layout` (one
  [first_row, stop_row] per layer), serialised as JSON with sorted keys, no
  whitespace and ASCII only, so the key is the same in every process and
  on every machine. A block's key does not depend on pages (it has none).

  Args:
    meta: the block's metadata.
    page_layout: for a page, the rows kept of each layer (see `put`).

  Returns:
    64 lowercase hex digits.
  """
  identity = {
    **meta_json(meta),
    'key_scheme': KEY_SCHEME,
    'stop': meta.start + len(meta.token_ids),
  }
  if page_layout is not None:
    identity['page_layout'] = [[int(a), int(b)] for a, b in page_layout]
  canonical = json.dumps(identity, sort_keys=True, separators=(',', ':'), ensure_ascii=True)
  return hashlib.sha256(canonical.encode('ascii')).hexdigest()


def new_hash(store_format: str = FORMAT):
  """A fresh hash object (`update`, `hexdigest`) of the digests of `store_format`."""
  return _HASHES[DIGEST_OF_FORMAT[store_format]]()


def chunk_separator(store_format: str = FORMAT) -> str:
  """What separates the parts of a chunk's key in `store_format`: '.' in format 4, else '/'."""
  return _SEPARATOR_OF_FORMAT[store_format]


def digest_fields(store_format: str = FORMAT) -> tuple[str, str]:
  """The names of an array entry's chunk digests and array digest in `store_format`:
  ('chunk_blake3', 'blake3') for formats 3 and 4, ('chunk_sha256', 'sha256') for format 2."""
  name = DIGEST_OF_FORMAT[store_format]
  return f'chunk_{name}', name


def array_digest(
  dtype: str, shape: Sequence[int], chunk_digests: Sequence[str], *, store_format: str = FORMAT
) -> str:
  """The two-level digest hex of an array, from its chunks' digests.

  Args:
    dtype: numpy name of the array's dtype, e.g. 'bfloat16'.
    shape: the array's shape.
    chunk_digests: digest hex of each chunk file's bytes, in chunk order.
    store_format: the manifest format, which names the hash (`DIGEST_OF_FORMAT`).

  Returns:
    The hash (BLAKE3 in formats 3 and 4, SHA-256 in format 2) hex over
    `f'{dtype}[{d0},{d1},...]\\n'` (ASCII) followed by the 32 raw bytes of each
    chunk digest.
  """
  digest = new_hash(store_format)
  digest.update(f'{dtype}[{",".join(map(str, shape))}]\n'.encode())
  for chunk_digest in chunk_digests:
    digest.update(bytes.fromhex(chunk_digest))
  return digest.hexdigest()


def build_manifest(
  key: str,
  meta_json: dict[str, Any],
  arrays: dict[str, np.ndarray],
  digests: dict[str, list[str]],
  page_layout: Sequence[Sequence[int]] | None = None,
  *,
  store_format: str = FORMAT,
  data: str | None = None,
) -> dict[str, Any]:
  """The manifest of a block (or page) in `store_format`, from its arrays' chunk digests;
  `data`, the payload's prefix (a `DATA_ID`), given exactly when the format has one."""
  chunk_field, array_field = digest_fields(store_format)
  manifest = {
    'format': store_format,
    'key': key,
    'layout_version': meta_json['layout_version'],
    'meta': meta_json,
    'arrays': {
      name: {
        'dtype': array.dtype.name,
        'shape': list(array.shape),
        'chunk_shape': store_chunks.chunk_shape(name, array.shape),
        chunk_field: digests[name],
        array_field: array_digest(
          array.dtype.name, array.shape, digests[name], store_format=store_format
        ),
      }
      for name, array in arrays.items()
    },
  }
  if page_layout is not None:
    manifest['page_layout'] = {'rows': [list(pair) for pair in page_layout]}
  if data is not None:
    manifest['data'] = data
  return manifest


def new_data_id() -> str:
  """A fresh `DATA_ID`: this second, and 128 random bits."""
  return f'{int(time.time()):010d}-{uuid.uuid4().hex}'


def data_prefix(manifest: dict[str, Any]) -> str:
  """Where a checked manifest's payload lies, relative to its block: `'<data>/'` in format
  5, `''` (beside the manifest) in the formats before."""
  return f'{manifest["data"]}/' if 'data' in manifest else ''


def payload_digest(manifest: dict[str, Any]) -> str:
  """One BLAKE3 hex naming a checked manifest's payload: over `name:digest` of each array
  (its array digest), sorted by name. Two writers' payloads are equal exactly when their
  manifests' arrays are, whatever their prefixes."""
  _, array_field = digest_fields(manifest['format'])
  text = ''.join(
    f'{name}:{entry[array_field]}\n' for name, entry in sorted(manifest['arrays'].items())
  )
  return blake3.blake3(text.encode('ascii')).hexdigest()


def meta_json(meta: blocks.BlockMeta) -> dict[str, Any]:
  """`meta.to_json()`, without `dataclasses.asdict`'s copy of each token id.

  That copy took about 0.1 s for 32k tokens, on every `get`; the manifest
  test checks that the two agree.
  """
  return {**_fields(meta), 'token_ids': list(meta.token_ids)}


def _fields(meta: blocks.BlockMeta) -> dict[str, Any]:
  """`meta`'s fields but token_ids, less those at their unrecorded value (as `to_json`)."""
  fields = {
    f.name: getattr(meta, f.name)
    for f in dataclasses.fields(meta)
    if f.name != 'token_ids' and not blocks.is_unrecorded(f.name, getattr(meta, f.name))
  }
  if 'tail_layers' in fields:
    fields['tail_layers'] = list(fields['tail_layers'])
  return fields


def check_manifest(manifest: Any) -> blocks.BlockMeta:
  """Checks a manifest's every field, type and size; returns its BlockMeta.

  The one validation of a manifest, for what `put` writes and `get` reads.
  What it does not check (array digests and chunk shapes against the chunk
  digests) `parse_manifest` does, and `store_read.read_block` checks every
  chunk against its digest.

  Raises:
    OtherFormatError: if `format` is not one of DIGEST_OF_FORMAT.
    MalformedError: naming the first field that is missing, extra, of the wrong
      type or out of range.
  """
  paged = type(manifest) is dict and 'page_layout' in manifest
  prefixed = type(manifest) is dict and manifest.get('format') == PREFIXED_FORMAT
  fields = _MANIFEST_FIELDS | ({'page_layout'} if paged else set())
  _check_object(manifest, fields | ({'data'} if prefixed else set()), 'manifest')
  if type(manifest['format']) is not str or manifest['format'] not in DIGEST_OF_FORMAT:
    raise OtherFormatError(manifest['format'])
  if prefixed and not (type(manifest['data']) is str and DATA_ID.fullmatch(manifest['data'])):
    raise store_errors.MalformedError(
      f'data is {store_errors.short(manifest["data"])}: expected a writer prefix'
      ' (10 digits, "-", 32 lowercase hex digits)'
    )
  chunk_field, array_field = digest_fields(manifest['format'])
  if not (type(manifest['key']) is str and HEX64.fullmatch(manifest['key'])):
    raise store_errors.MalformedError(
      f'key is {store_errors.short(manifest["key"])}: expected 64 lowercase hex digits'
    )
  meta = check_meta(manifest['meta'])
  if meta.dtype not in KV_DTYPES:
    raise store_errors.MalformedError(f'cannot store k/v of dtype {meta.dtype!r}; only {KV_DTYPES}')
  if type(manifest['layout_version']) is not int or (
    manifest['layout_version'] != meta.layout_version
  ):
    raise store_errors.MalformedError(
      f'layout_version {manifest["layout_version"]!r} != meta.layout_version'
      f' {meta.layout_version!r}'
    )
  entries = manifest['arrays']
  n = len(meta.token_ids)
  names = list(ARRAY_NAMES)
  tail = meta.tail_layers
  expected_rows = {}
  if meta.tail_rows:  # a compact block's tail: the last tail_rows rows of each tail layer
    names = list(PAGE_ARRAY_NAMES)
    expected_rows = {'k_tail': (len(tail), meta.tail_rows), 'v_tail': (len(tail), meta.tail_rows)}
  if paged and tail:
    raise store_errors.MalformedError(
      f'page_layout beside meta.tail_layers {list(tail)}: a compact block records its rows'
      ' in its metadata (tail_layers, tail_rows)'
    )
  if paged:
    _check_object(manifest['page_layout'], {'rows'}, 'page_layout')
    rows = manifest['page_layout']['rows']
    if type(rows) is not list or not all(type(pair) is list for pair in rows):
      raise store_errors.MalformedError(
        f'page_layout.rows is {store_errors.short(rows)}: expected a list of [first, stop]'
      )
    num_layers = len(rows)
    layout = store_pages.checked_layout(rows, num_layers, n)
    whole = sum(1 for first, _ in layout if first == 0)
    kept = n - max(first for first, _ in layout)
    names = [name for name in PAGE_ARRAY_NAMES if kept or not name.endswith('_tail')]
    expected_rows = {'k': (whole, n), 'v': (whole, n)}
    expected_rows.update(
      {'k_tail': (num_layers - whole, kept), 'v_tail': (num_layers - whole, kept)}
    )
  _check_object(entries, set(names), 'arrays')
  for name in names:
    entry = entries[name]
    _check_object(
      entry, {'dtype', 'shape', 'chunk_shape', chunk_field, array_field}, f'arrays.{name}'
    )
    dtype = 'int32' if name == 'positions' else meta.dtype
    if entry['dtype'] != dtype:
      raise store_errors.MalformedError(
        f'arrays.{name}.dtype is {entry["dtype"]!r}, expected {dtype!r}'
      )
    shape = entry['shape']
    for field in ('shape', 'chunk_shape'):
      dims = entry[field]
      if not (
        type(dims) is list
        and dims
        and all(type(d) is int and 0 < d <= store_chunks.INT32[1] for d in dims)
      ):
        raise store_errors.MalformedError(
          f'arrays.{name}.{field} is {dims!r}: expected positive int32 sizes'
        )
    if name == 'positions' and shape != [n]:
      raise store_errors.MalformedError(
        f'arrays.positions.shape is {shape}, expected [{n}] for {n} token ids'
      )
    if name in ('k', 'v') and not paged and (len(shape) != 4 or shape[1] != n):
      raise store_errors.MalformedError(f'arrays.{name}.shape is {shape}, expected [L, {n}, K, H]')
    if name in expected_rows and (len(shape) != 4 or tuple(shape[:2]) != expected_rows[name]):
      layers, rows_kept = expected_rows[name]
      raise store_errors.MalformedError(
        f'arrays.{name}.shape is {shape}, expected [{layers}, {rows_kept}, K, H] by page_layout'
      )
    if name == 'v' and shape != entries['k']['shape']:
      raise store_errors.MalformedError(
        f'arrays.v.shape {shape} != arrays.k.shape {entries["k"]["shape"]}'
      )
    if name == 'v_tail' and shape != entries['k_tail']['shape']:
      raise store_errors.MalformedError(
        f'arrays.v_tail.shape {shape} != arrays.k_tail.shape {entries["k_tail"]["shape"]}'
      )
    if name == 'k_tail' and paged and shape[2:] != entries['k']['shape'][2:]:
      raise store_errors.MalformedError(
        f'arrays.k_tail.shape {shape} and arrays.k.shape differ in [K, H]'
      )
    digests = entry[chunk_field]
    count = shape[0] // store_chunks.chunk_shape(name, shape)[0]
    if not (
      type(digests) is list
      and len(digests) == count
      and all(type(d) is str and HEX64.fullmatch(d) for d in digests)
    ):
      raise store_errors.MalformedError(
        f'array {name!r} of shape {shape} needs {count} chunk digests (64 lowercase hex'
        f' digits each), got {store_errors.short(digests)}'
      )
    if not (type(entry[array_field]) is str and HEX64.fullmatch(entry[array_field])):
      raise store_errors.MalformedError(
        f'arrays.{name}.{array_field} is {store_errors.short(entry[array_field])}:'
        ' expected 64 hex digits'
      )
  return meta


def check_meta(data: Any) -> blocks.BlockMeta:
  """A BlockMeta from its JSON form, every field of the type it declares.

  The fields and their types come from `blocks.BlockMeta` itself; integers
  must lie in int32, `start` and token ids must not be negative, and the
  result must give back exactly `data` (no value narrowed or dropped).
  """
  hints = _meta_hints()
  if type(data) is not dict:
    raise store_errors.MalformedError(f'meta is {store_errors.short(data)}: expected a JSON object')
  try:
    meta = blocks.BlockMeta.from_json(data)
  except _UNSUPPORTED_LAYOUT as e:
    raise OtherFormatError(
      f'meta.layout_version {store_errors.short(data.get("layout_version"))}'
    ) from e
  except (ValueError, TypeError, KeyError, OverflowError) as e:  # blocks.BlockMetaError
    raise store_errors.MalformedError(str(e)) from e
  # Token ids are exact ints in [0, 2^31), checked once by BlockMeta itself, and read back
  # as written (a tuple of the same ints): at 32k tokens each pass over them costs ~1 ms.
  for name, value in data.items():  # whatever from_json lets through
    if name != 'token_ids':
      _check_type(value, hints.get(name), f'meta.{name}')
  if data['start'] < 0:
    raise store_errors.MalformedError(f'meta.start is {data["start"]}: a slot cannot be negative')
  if {**_fields(meta), 'token_ids': data['token_ids']} != data:
    raise store_errors.MalformedError('meta does not read back as written')
  return meta


@functools.cache
def _meta_hints() -> dict[str, Any]:
  """`BlockMeta`'s field types (evaluated once: its annotations are strings)."""
  return typing.get_type_hints(blocks.BlockMeta)


def _check_type(value: Any, hint: Any, where: str) -> None:
  """Raises MalformedError unless `value` (JSON or Python) is a `hint`.

  Knows str, int (int32, not bool), bool, float, tuple[X, ...], unions and
  enums; a type it does not know is left to `BlockMeta.from_json`.
  """
  origin = typing.get_origin(hint)
  if origin in (typing.Union, types.UnionType):
    errors = []
    for arm in typing.get_args(hint):
      try:
        return _check_type(value, arm, where)
      except store_errors.MalformedError as e:
        errors.append(str(e))
    raise store_errors.MalformedError('; '.join(errors))
  if hint is type(None):
    ok = value is None
  elif hint is int:
    ok = type(value) is int and store_chunks.INT32[0] <= value <= store_chunks.INT32[1]
  elif hint in (str, bool):
    ok = type(value) is hint
  elif hint is float:
    ok = type(value) in (int, float) and math.isfinite(value)
  elif origin is tuple:
    if type(value) not in (list, tuple):
      raise store_errors.MalformedError(f'{where} is {store_errors.short(value)}: expected a list')
    item = typing.get_args(hint)[0]
    low, high = store_chunks.INT32
    if item is int and set(map(type, value)) <= {int} and low <= min(value, default=0):
      if max(value, default=0) <= high:  # all fine: skip the item-by-item walk (32k token ids)
        return
    for i, x in enumerate(value):
      _check_type(x, item, f'{where}.{i}')
    return
  elif isinstance(hint, type) and issubclass(hint, enum.Enum):
    ok = isinstance(value, hint) or value in {m.value for m in hint}
  else:
    return
  if not ok:
    name = getattr(hint, '__name__', str(hint))
    bound = ' in int32' if hint is int else ''
    raise store_errors.MalformedError(
      f'{where} is {store_errors.short(value)}: expected {name}{bound}'
    )


def _check_object(value: Any, names: set[str], where: str) -> None:
  if type(value) is not dict:
    raise store_errors.MalformedError(
      f'{where} is {store_errors.short(value)}: expected a JSON object'
    )
  if value.keys() != names:
    raise store_errors.MalformedError(
      f'{where} has fields {sorted(value)}, expected {sorted(names)}'
    )


def load_json(data: bytes) -> Any:
  """JSON from ASCII bytes, refusing duplicate keys; raises MalformedError."""

  def no_duplicates(pairs):
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
      raise store_errors.MalformedError(
        f'duplicate key {min(n for n in names if names.count(n) > 1)!r}'
      )
    return dict(pairs)

  try:
    return json.loads(data.decode('ascii'), object_pairs_hook=no_duplicates)
  except RecursionError:
    raise store_errors.MalformedError('JSON nested too deeply') from None
  except (ValueError, OverflowError) as e:  # UnicodeDecodeError, JSONDecodeError, digit limit
    raise store_errors.MalformedError(str(e)) from e


def parse_manifest(data: bytes, path: str, key: str) -> tuple[dict[str, Any], blocks.BlockMeta]:
  """The manifest and its BlockMeta, checked by `check_manifest`, for `key`, and against its
  own chunk digests (its array digests and chunk shapes must be what they give).

  A manifest parsed before under the same key from the same bytes is not parsed again (the
  checks depend on those two alone): the earlier result is returned, shared, so it must
  not be modified. At 32k tokens a parse takes ~10 ms, more than a restore's other checks.
  """
  parsed = _PARSED.get(key, data)
  if parsed is None:
    parsed = _parse_manifest(data, path, key)
    _PARSED.put(key, data, parsed)
  return parsed


class _ParsedManifests:
  """Manifests parsed, by key, least recently used dropped first beyond `max_bytes` of text."""

  def __init__(self, max_bytes: int):
    self._max_bytes = max_bytes
    self._held = collections.OrderedDict()  # key -> (bytes, (manifest, meta))
    self._bytes = 0
    self._lock = threading.Lock()

  def get(self, key: str, data: bytes) -> tuple[dict[str, Any], blocks.BlockMeta] | None:
    with self._lock:
      held = self._held.get(key)
      if held is None or held[0] != data:
        return None
      self._held.move_to_end(key)
      return held[1]

  def put(self, key: str, data: bytes, parsed: tuple[dict[str, Any], blocks.BlockMeta]) -> None:
    with self._lock:
      old = self._held.pop(key, None)
      self._bytes += len(data) - (len(old[0]) if old else 0)
      self._held[key] = (data, parsed)
      while self._bytes > self._max_bytes:
        _, (dropped, _) = self._held.popitem(last=False)
        self._bytes -= len(dropped)

  def clear(self) -> None:
    with self._lock:
      self._held.clear()
      self._bytes = 0


_PARSED = _ParsedManifests(16 << 20)  # a 32k-token manifest is ~450 kB


def forget_parsed() -> None:
  """Drops every manifest `parse_manifest` kept: the next read of each parses it again (to
  time a block's first read)."""
  _PARSED.clear()


def _parse_manifest(data: bytes, path: str, key: str) -> tuple[dict[str, Any], blocks.BlockMeta]:
  try:
    manifest = load_json(data)
    meta = check_manifest(manifest)
  except OtherFormatError as e:
    found = e.args[0]
    if isinstance(found, str) and found.startswith('meta.layout_version'):
      cause = f'{MANIFEST} has {found}; this code reads only {blocks.LAYOUT_VERSION}'
    else:
      cause = (
        f'{MANIFEST} has format {store_errors.short(found)}; this code reads only'
        f' {", ".join(map(repr, DIGEST_OF_FORMAT))}'
      )
    raise store_errors.UnsupportedFormatError(path, cause) from None
  except store_errors.MalformedError as e:
    raise store_errors.CorruptBlockError(path, f'malformed {MANIFEST}: {e}') from e
  layout = store_pages.layout_of(manifest)
  described = key_for(meta, layout)
  if described != key:
    raise store_errors.CorruptBlockError(path, f'{MANIFEST} describes block {described}')
  # Its array digests and chunk shapes, from its chunk digests (each chunk is then checked
  # against its digest as it is read, so this is the payload's manifest if all pass).
  chunk_field, _ = digest_fields(manifest['format'])
  entries = manifest['arrays']
  rebuilt = build_manifest(
    key,
    meta_json(meta),
    {name: _shape_only(entry) for name, entry in entries.items()},
    {name: entry[chunk_field] for name, entry in entries.items()},
    layout,
    store_format=manifest['format'],
    data=manifest.get('data'),
  )
  found = differences(manifest, rebuilt)
  if found:
    raise store_errors.CorruptBlockError(
      path,
      f'{MANIFEST} disagrees with its chunk digests (manifest != rebuilt from them):'
      f' {"; ".join(found)}',
    )
  return manifest, meta


def _shape_only(entry: dict[str, Any]) -> np.ndarray:
  """A zero-byte array of an entry's dtype and shape (what `build_manifest` looks at)."""
  return np.broadcast_to(np.zeros((), store_chunks.DTYPES[entry['dtype']]), entry['shape'])


def differences(a: Any, b: Any, where: str = '') -> list[str]:
  """Where two JSON values differ, as 'path: a != b' lines.

  Dicts are compared key by key and lists of one length item by item, so a
  path such as 'arrays.k.chunk_blake3.3' names the differing chunk.
  """
  if a == b:
    return []
  if isinstance(a, dict) and isinstance(b, dict):
    return [
      line
      for name in sorted(a.keys() | b.keys())
      for line in differences(a.get(name), b.get(name), f'{where}{name}.')
    ]
  if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
    return [
      line for i, (x, y) in enumerate(zip(a, b)) for line in differences(x, y, f'{where}{i}.')
    ]
  return [f'{where[:-1]}: {store_errors.short(a)} != {store_errors.short(b)}']
