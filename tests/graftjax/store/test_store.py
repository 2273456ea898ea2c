"""Tests for graftjax.store: round trips, keys, damage, escapes and races."""

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import blake3
import ml_dtypes
import numpy as np
import pytest

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.store import chunks as store_chunks
from graftjax.store import encode as store_encode
from graftjax.store import files as store_files
from graftjax.store import kvstore as store_kvstore
from graftjax.store import manifest as store_manifest
from graftjax.store import read as store_read

FINGERPRINT = hashlib.sha256(b'tiny test model').hexdigest()
_BITS = {'float32': np.uint32, 'bfloat16': np.uint16}
_DTYPES = {'float32': np.float32, 'bfloat16': ml_dtypes.bfloat16}
_EXPONENT = {'float32': 0x7F800000, 'bfloat16': 0x7F80}
_SHAPE = (3, 3, 1, 4)  # [L, n, K, H]
_CHUNK = 'k/c.0.0.0.0'  # layer 0 of k
_CHUNK_BYTES = 3 * 1 * 4 * 4  # one float32 layer [1, n, K, H]

# Seeds the two concurrent writers deposit: a shared run, then their own.
WORKER_SEEDS = {
  0: list(range(6)) + [100, 101, 102],
  1: list(range(6)) + [200, 201, 202],
  2: list(range(3, 9)) + [300, 301],
}


def make_block(seed, dtype='float32', *, start=5, k=None):
  """A tiny block of random finite bit patterns (-0 and subnormals included)."""
  rng = np.random.default_rng(seed)
  n = _SHAPE[1]
  exponent = _EXPONENT[dtype]

  def random_bits():
    bits = rng.integers(0, np.iinfo(_BITS[dtype]).max, _SHAPE, dtype=_BITS[dtype], endpoint=True)
    bits[(bits & exponent) == exponent] ^= exponent & (exponent >> 1)  # no NaN, no infinity
    return bits.view(_DTYPES[dtype])

  meta = blocks.BlockMeta(
    model_fingerprint=FINGERPRINT,
    token_ids=tuple(int(t) for t in rng.integers(0, 262_144, n)),
    start=start,
    dtype=dtype,
    position_scheme='rope',
    capacity=64,
    first_position=start,
  )
  return blocks.KVBlock(
    k=random_bits() if k is None else k,
    v=random_bits(),
    positions=np.arange(start, start + n, dtype=np.int32),
    meta=meta,
  )


def _bits(array):
  array = np.asarray(array)
  return array.view(_BITS[array.dtype.name])


def _assert_same_block(got, want):
  assert got.meta == want.meta
  got_arrays, want_arrays = got.arrays(), want.arrays()
  for name in ('k', 'v'):
    assert got_arrays[name].dtype == want_arrays[name].dtype
    np.testing.assert_array_equal(_bits(got_arrays[name]), _bits(want_arrays[name]))
  assert got_arrays['positions'].dtype == np.int32
  np.testing.assert_array_equal(got.positions, want.positions)


def _blake3(data):
  return blake3.blake3(data).hexdigest()


def _layer_digests(array):
  """SHA-256 hex of each layer's raw bytes: the chunk digests of k or v."""
  return [_blake3(np.asarray(layer).tobytes()) for layer in array]


def _flip_byte(path, offset):
  with open(path, 'r+b') as f:
    f.seek(offset)
    byte = f.read(1)
    f.seek(offset)
    f.write(bytes([byte[0] ^ 0x01]))


def _edit_json(path, edit):
  with open(path) as f:
    data = json.load(f)
  edit(data)
  with open(path, 'w') as f:
    json.dump(data, f)


@pytest.fixture
def store(tmp_path):
  return store_lib.BlockStore(tmp_path / 'store')


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_round_trip_is_bit_exact(store, dtype):
  block = make_block(0, dtype)

  got = store.get(store.put(block))

  _assert_same_block(got, block)
  assert got.k.dtype == np.dtype(_DTYPES[dtype])
  assert all(isinstance(a, np.ndarray) for a in got.arrays().values())


def test_round_trip_reading_chunks_in_small_uneven_pieces(store, monkeypatch):
  block = make_block(0)
  key = store.put(block)
  # Each 48-byte chunk in six 7-byte pieces and one of 6 bytes.
  monkeypatch.setattr(store_read, 'PIECE', 7)

  _assert_same_block(store.get(key), block)
  _flip_byte(os.path.join(store.root, key, 'k', 'c.1.0.0.0'), 44)
  with pytest.raises(store_lib.CorruptBlockError, match="array 'k' layer 1"):
    store.get(key)


def test_get_into_the_callers_arrays_and_refuses_a_layout_it_cannot_fill(tmp_path):
  """On file (straight from the files) and memory (through kvstore values) alike."""
  block = make_block(0)
  for root in (tmp_path / 'store', 'memory://'):
    store = store_lib.BlockStore(root)
    key = store.put(block)
    wide = {}

    def into(meta, shapes):  # k, v as views of wider rows: each layer still contiguous
      assert meta == block.meta
      wide.update({name: np.full((*shape[:1], shape[1] + 2, *shape[2:]), 7.0, np.float32)
                   for name, shape in shapes.items() if name != 'positions'})  # fmt: skip
      return {
        **{name: array[:, : shapes[name][1]] for name, array in wide.items()},
        'positions': np.empty(shapes['positions'], np.int32),
      }

    got = store.get(key, into=into)
    _assert_same_block(got, block)
    assert np.shares_memory(got.k, wide['k']) and (wide['k'][:, -2:] == 7).all()

    def strided(meta, shapes):  # every other element: a layer is not contiguous
      return {name: np.empty((*shape[:-1], 2 * shape[-1]), np.float32)[..., ::2]
              if name != 'positions' else np.empty(shape, np.int32)
              for name, shape in shapes.items()}  # fmt: skip

    with pytest.raises(ValueError, match=r'`into` gave k float32\[3, 3, 1, 4\]'):
      store.get(key, into=strided)


def test_round_trip_keeps_zero_and_negative_zero_chunks(store):
  block = make_block(0, k=np.zeros(_SHAPE, np.float32))
  block = dataclasses.replace(block, v=np.full(_SHAPE, -0.0, np.float32))

  key = store.put(block)

  # tensorstore skips chunks equal to the fill value unless told otherwise.
  assert os.path.isfile(os.path.join(store.root, key, _CHUNK))
  _assert_same_block(store.get(key), block)


def test_manifest_records_meta_shapes_and_documented_digests(store):
  block = make_block(0, 'bfloat16')

  key = store.put(block)

  with open(os.path.join(store.root, key, 'manifest.json')) as f:
    manifest = json.load(f)
  assert manifest['format'] == 'graftjax.blockstore/4'
  assert manifest['key'] == key
  assert manifest['layout_version'] == block.meta.layout_version == 2  # made without a chunk size
  assert manifest['meta'] == block.meta.to_json()
  layers = _layer_digests(block.k)
  assert len(set(layers)) == _SHAPE[0]
  for layer, digest in enumerate(layers):
    with open(os.path.join(store.root, key, f'k/c.{layer}.0.0.0'), 'rb') as f:
      assert _blake3(f.read()) == digest
  two_level = _blake3(b'bfloat16[3,3,1,4]\n' + b''.join(bytes.fromhex(d) for d in layers))
  assert manifest['arrays']['k'] == {
    'dtype': 'bfloat16',
    'shape': list(_SHAPE),
    'chunk_shape': [1, *_SHAPE[1:]],
    'chunk_blake3': layers,
    'blake3': two_level,
  }
  assert store_lib.array_digest('bfloat16', _SHAPE, layers) == two_level
  positions_digest = _blake3(np.asarray(block.positions).tobytes())
  assert manifest['arrays']['positions'] == {
    'dtype': 'int32',
    'shape': [_SHAPE[1]],
    'chunk_shape': [_SHAPE[1]],
    'chunk_blake3': [positions_digest],
    'blake3': store_lib.array_digest('int32', [3], [positions_digest]),
  }


def test_key_is_pinned():
  meta = blocks.BlockMeta(
    model_fingerprint='0' * 64,
    token_ids=(2, 818, 5279),
    start=0,
    dtype='bfloat16',
    position_scheme='rope',
    capacity=8,
    layout_version=2,
  )

  canonical = (
    '{"batch_size":1,"capacity":8,"dtype":"bfloat16","first_position":0,'
    '"key_scheme":"graftjax.block-key/3","layout_version":2,"model_fingerprint":"' + '0' * 64 + '",'
    '"position_scheme":"rope","segment":0,"shift":0,"start":0,"stop":3,"token_ids":[2,818,5279]}'
  )

  key = store_lib.key_for(meta)

  assert key == hashlib.sha256(canonical.encode()).hexdigest()
  assert key == ('3d71e01d8933e80f69ff3f29df0b5e8d8706b81e2f280b5d58b1a2cb1d0f61c5')


def test_key_is_stable_across_processes():
  meta = make_block(0).meta
  script = textwrap.dedent("""
      import json, sys
      from graftjax import blocks, store
      meta = blocks.BlockMeta.from_json(json.loads(sys.argv[1]))
      print(store.key_for(meta))
  """)

  result = subprocess.run(
    [sys.executable, '-c', script, json.dumps(meta.to_json())],
    env={**os.environ, 'PYTHONHASHSEED': '12345'},
    capture_output=True,
    text=True,
    check=True,
    timeout=120,
  )

  assert result.stdout.strip() == store_lib.key_for(meta)


@pytest.mark.parametrize(
  'change',
  [
    {'model_fingerprint': 'e' * 64},
    {'token_ids': (1, 2, 4)},
    {'start': 6},
    {'dtype': 'bfloat16'},
    {'position_scheme': 'alibi'},
    {'layout_version': 1},
    {'chunk_size': 4},
    {'capacity': 65},
    {'batch_size': 2},
    {'segment': 1},
  ],
)
def test_key_changes_with_every_identity_field(change):
  meta = dataclasses.replace(make_block(0).meta, token_ids=(1, 2, 3))

  assert store_lib.key_for(dataclasses.replace(meta, **change)) != (store_lib.key_for(meta))


def test_list_shows_only_complete_blocks(store):
  keys = sorted(store.put(make_block(seed)) for seed in (1, 2))
  # A crashed deposit, a block dir without its manifest, and a stray dir.
  crashed = os.path.join(store.root, '.tmp', f'{"c" * 64}.deadbeef')
  os.makedirs(os.path.join(crashed, 'k', 'c'))
  os.makedirs(os.path.join(store.root, 'd' * 64, 'k'))
  os.makedirs(os.path.join(store.root, 'not-a-key'))

  assert store.list() == keys
  assert keys[0] in store
  assert 'd' * 64 not in store
  assert 'c' * 64 not in store


def test_flipped_byte_in_k_is_named_with_both_digests(store):
  block = make_block(0, 'bfloat16')
  key = store.put(block)
  chunk = os.path.join(store.root, key, _CHUNK)
  _flip_byte(chunk, 5)
  expected = _layer_digests(block.k)[0]
  with open(chunk, 'rb') as f:
    found = _blake3(f.read())
  assert found != expected

  for read in (store.verify, store.get):
    with pytest.raises(store_lib.CorruptBlockError) as error:
      read(key)
    assert (f"array 'k' layer 0 ({_CHUNK}): digest expected {expected}, found {found}") in str(
      error.value
    )


def _stored_in_format(store, block, store_format):
  """Stores `block` as `store_format` wrote it (its digests, its chunk keys); returns its key."""
  key = store.put(block)
  files, _ = store_encode.block_files(block, store.root, None, store_format)
  shutil.rmtree(os.path.join(store.root, key))
  for name, data in files.items():
    path = os.path.join(store.root, key, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
      f.write(data)
  return key


@pytest.mark.parametrize(
  'store_format, digest, new_hash',
  [('graftjax.blockstore/2', 'sha256', hashlib.sha256), ('graftjax.blockstore/3', 'blake3', None)],
)
def test_older_format_blocks_are_read_and_checked_by_their_hash(
  store, store_format, digest, new_hash
):
  """Formats 2 (SHA-256) and 3 (BLAKE3) keep chunks under '/'-separated keys."""
  hex_digest = lambda data: new_hash(data).hexdigest() if new_hash else _blake3(data)
  block = make_block(0, 'bfloat16')
  key = _stored_in_format(store, block, store_format)
  with open(os.path.join(store.root, key, 'manifest.json')) as f:
    manifest = json.load(f)
  layers = [hex_digest(np.asarray(layer).tobytes()) for layer in block.k]
  assert manifest['format'] == store_format
  assert manifest['arrays']['k'][f'chunk_{digest}'] == layers
  _assert_same_block(store.get(key), block)
  assert store.put(block) == key  # the same payload: a no-op, not a conflict

  k = np.asarray(block.k).copy()
  k[1, 0, 0, 0] = -k[1, 0, 0, 0]
  with pytest.raises(store_lib.ConflictingBlockError, match=rf'arrays\.k\.chunk_{digest}\.1'):
    store.put(dataclasses.replace(block, k=k))

  chunk = os.path.join(store.root, key, 'k/c/0/0/0/0')
  _flip_byte(chunk, 5)
  with open(chunk, 'rb') as f:
    found = hex_digest(f.read())
  with pytest.raises(store_lib.CorruptBlockError) as error:
    store.get(key)
  assert f'(k/c/0/0/0/0): digest expected {layers[0]}, found {found}' in str(error.value)


@pytest.mark.parametrize('offset', [0, _CHUNK_BYTES - 1])
def test_flipped_byte_in_a_middle_layer_names_that_layer(store, offset):
  block = make_block(0)
  key = store.put(block)
  chunk = 'v/c.1.0.0.0'
  _flip_byte(os.path.join(store.root, key, chunk), offset)
  expected = _layer_digests(block.v)[1]
  with open(os.path.join(store.root, key, chunk), 'rb') as f:
    found = _blake3(f.read())

  for read in (store.verify, store.get):
    with pytest.raises(store_lib.CorruptBlockError) as error:
      read(key)
    assert str(error.value) == (
      f"{store.root}/{key}: array 'v' layer 1 ({chunk}): digest expected {expected}, found {found}"
    )
    assert error.value.path == f'{store.root}/{key}'


def test_flipped_byte_in_positions_is_named(store):
  key = store.put(make_block(0))
  _flip_byte(os.path.join(store.root, key, 'positions', 'c.0'), 0)

  with pytest.raises(
    store_lib.CorruptBlockError,
    match=r"array 'positions' \(positions/c.0\): digest expected",
  ):
    store.get(key)


def test_swapped_layer_chunks_are_caught(store):
  key = store.put(make_block(0))
  layer = lambda i: os.path.join(store.root, key, f'k/c.{i}.0.0.0')
  os.rename(layer(0), layer(0) + '.swap')
  os.rename(layer(2), layer(0))
  os.rename(layer(0) + '.swap', layer(2))

  with pytest.raises(store_lib.CorruptBlockError, match="array 'k' layer 0"):
    store.verify(key)


def test_truncated_array_file_is_named_with_sizes(store):
  key = store.put(make_block(0))
  chunk = os.path.join(store.root, key, _CHUNK)
  os.truncate(chunk, os.path.getsize(chunk) - 3)

  for read in (store.verify, store.get):
    with pytest.raises(
      store_lib.CorruptBlockError,
      match=(
        f"array 'k' layer 0 \\({_CHUNK}\\): holds {_CHUNK_BYTES - 3} bytes, expected {_CHUNK_BYTES}"
      ),
    ):
      read(key)


def test_chunk_size_is_checked_on_the_bytes_read(store, monkeypatch):
  """No stat before the read: a chunk that shrinks after listing is caught as read."""
  key = store.put(make_block(0))
  listing = store_read._listing

  def list_then_truncate(*args):
    files = listing(*args)
    os.truncate(os.path.join(store.root, key, 'v', 'c.2.0.0.0'), 5)
    return files

  monkeypatch.setattr(store_read, '_listing', list_then_truncate)

  with pytest.raises(
    store_lib.CorruptBlockError,
    match=rf"array 'v' layer 2 \(v/c.2.0.0.0\): holds 5 bytes, expected {_CHUNK_BYTES}",
  ):
    store.get(key)


def test_missing_manifest_is_named_and_block_is_not_listed(store):
  key = store.put(make_block(0))
  os.remove(os.path.join(store.root, key, 'manifest.json'))

  for read in (store.verify, store.get):
    with pytest.raises(store_lib.CorruptBlockError, match='missing file manifest.json'):
      read(key)
  assert key not in store
  assert not store.list()


def test_missing_chunk_file_is_named(store):
  key = store.put(make_block(0, k=np.zeros(_SHAPE, np.float32)))
  os.remove(os.path.join(store.root, key, 'k', 'c.2.0.0.0'))

  # Without the file check, tensorstore could read back the zeros it lost.
  with pytest.raises(store_lib.CorruptBlockError, match='missing file k/c.2.0.0.0$'):
    store.verify(key)


def test_extra_chunk_file_is_named(store):
  key = store.put(make_block(0))
  with open(os.path.join(store.root, key, 'k', 'c.3.0.0.0'), 'wb') as f:
    f.write(bytes(_CHUNK_BYTES))

  with pytest.raises(store_lib.CorruptBlockError, match='unexpected file k/c.3.0.0.0$'):
    store.verify(key)


def test_other_format_is_refused_by_name(store):
  key = store.put(make_block(0))
  manifest = os.path.join(store.root, key, 'manifest.json')
  _edit_json(manifest, lambda m: m.update(format='graftjax.blockstore/1'))

  for read in (store.verify, store.get, lambda _: store.put(make_block(0))):
    with pytest.raises(
      store_lib.UnsupportedFormatError,
      match=(
        f"{key}: manifest.json has format 'graftjax.blockstore/1';"
        " this code reads only 'graftjax.blockstore/2', 'graftjax.blockstore/3',"
        " 'graftjax.blockstore/4'"
      ),
    ):
      read(key)


def test_manifest_with_a_missing_chunk_digest_is_malformed(store):
  key = store.put(make_block(0))
  _edit_json(
    os.path.join(store.root, key, 'manifest.json'),
    lambda m: m['arrays']['v']['chunk_blake3'].pop(),
  )

  with pytest.raises(
    store_lib.CorruptBlockError,
    match=(
      r"malformed manifest.json: array 'v' of shape \[3, 3, 1, 4\] needs"
      ' 3 chunk digests'
    ),
  ):
    store.verify(key)


@pytest.mark.parametrize(
  'field, value',
  [
    ('blake3', '0' * 64),
    ('chunk_shape', [3, 3, 1, 4]),
  ],
)
def test_manifest_disagreeing_with_its_chunks_is_named(store, field, value):
  key = store.put(make_block(0))
  _edit_json(
    os.path.join(store.root, key, 'manifest.json'),
    lambda m: m['arrays']['k'].update({field: value}),
  )

  with pytest.raises(
    store_lib.CorruptBlockError,
    match=f'manifest.json disagrees with its chunk digests .*arrays.k.{field}',
  ):
    store.verify(key)


def test_manifest_meta_in_another_spelling_is_refused(store):
  block = make_block(0)
  key = store.put(block)
  token = block.meta.token_ids[0]
  # A token id spelt as a string is refused when the metadata is parsed.
  _edit_json(
    os.path.join(store.root, key, 'manifest.json'),
    lambda m: m['meta']['token_ids'].__setitem__(0, str(token)),
  )

  with pytest.raises(
    store_lib.CorruptBlockError,
    match=f"malformed manifest.json: block metadata field 'token_ids': item 0: .*'{token}'",
  ):
    store.verify(key)


@pytest.mark.parametrize(
  'change',
  [
    {'chunk_grid': {'name': 'regular', 'configuration': {'chunk_shape': [3, 3, 1, 4]}}},
    {'data_type': 'int32'},
    {'chunk_key_encoding': {'name': 'v2'}},
    {'codecs': [{'name': 'bytes', 'configuration': {'endian': 'big'}}]},
    {'storage_transformers': [{'name': 'x'}]},
  ],
)
def test_zarr_metadata_that_would_read_otherwise_is_refused(store, change):
  block = make_block(0)
  key = store.put(block)
  metadata = os.path.join(store.root, key, 'k', 'zarr.json')
  _edit_json(metadata, lambda m: m.update(change))

  with pytest.raises(
    store_lib.CorruptBlockError,
    match=f'k/zarr.json disagrees with manifest.json .*{next(iter(change))}',
  ):
    store.get(key)


def test_manifest_moved_to_another_key_is_refused(store):
  key = store.put(make_block(0))
  other = 'a' * 64
  os.rename(os.path.join(store.root, key), os.path.join(store.root, other))

  with pytest.raises(
    store_lib.CorruptBlockError,
    match=f'{other}: manifest.json describes block {key}',
  ):
    store.get(other)


@pytest.mark.parametrize(
  'key',
  [
    '../x',
    '/etc/passwd',
    '',
    '.',
    '..',
    '.tmp',
    'A' * 64,
    'g' * 64,
    'a' * 63,
    'a' * 65,
    'a' * 64 + '\n',
    '../' + 'a' * 61,
    'a' * 32 + '/' + 'a' * 31,
    None,
  ],
)
def test_invalid_keys_are_rejected(store, tmp_path, key):
  bystander = tmp_path / 'x'
  bystander.write_text('not the store')

  for operation in (store.get, store.verify, store.delete, store.__contains__):
    with pytest.raises(
      store_lib.InvalidKeyError,
      match='invalid block key .*: expected 64 lowercase hex digits',
    ):
      operation(key)
  assert bystander.read_text() == 'not the store'


def test_symlinked_block_is_refused(tmp_path):
  elsewhere = store_lib.BlockStore(tmp_path / 'elsewhere')
  key = elsewhere.put(make_block(0))
  store = store_lib.BlockStore(tmp_path / 'store')
  os.symlink(os.path.join(elsewhere.root, key), os.path.join(store.root, key))

  with pytest.raises(store_lib.UnsafePathError, match=f'{key}: the block is a symlink'):
    store.get(key)
  with pytest.raises(store_lib.UnsafePathError, match='symlink'):
    store.put(make_block(0))
  assert key not in store
  assert not store.list()


def test_symlink_inside_block_is_refused(store, tmp_path):
  key = store.put(make_block(0))
  metadata = os.path.join(store.root, key, 'k', 'zarr.json')
  os.replace(metadata, tmp_path / 'zarr.json')
  os.symlink(tmp_path / 'zarr.json', metadata)

  with pytest.raises(store_lib.UnsafePathError, match=f'{key}: k/zarr.json is a symlink'):
    store.verify(key)


def test_put_is_idempotent(store):
  block = make_block(0)
  key = store.put(block)
  manifest = os.path.join(store.root, key, 'manifest.json')
  before = store_lib.digest_tree(os.path.join(store.root, key))
  written_at = os.stat(manifest).st_mtime_ns

  assert store.put(make_block(0)) == key

  assert store_lib.digest_tree(os.path.join(store.root, key)) == before
  assert os.stat(manifest).st_mtime_ns == written_at
  assert store.list() == [key]


def test_put_of_another_payload_under_a_stored_key_names_the_difference(store):
  block = make_block(0)
  key = store.put(block)
  k = np.asarray(block.k).copy()
  k[1, 0, 0, 0] += np.float32(1)
  other = dataclasses.replace(block, k=k)
  old, new = _layer_digests(block.k), _layer_digests(k)
  old_k = store_lib.array_digest('float32', _SHAPE, old)
  new_k = store_lib.array_digest('float32', _SHAPE, new)

  stored = json.loads((pathlib.Path(store.root) / key / store_lib.MANIFEST).read_text())
  _, manifest = store_encode.block_files(other, store.root)
  digests = [store_manifest.payload_digest(m) for m in (stored, manifest)]

  with pytest.raises(store_lib.ConflictingBlockError) as error:
    store.put(other)
  assert str(error.value) == (
    f'{store.root}/{key}: the block is already stored with another payload (stored'
    f' {digests[0]} != new {digests[1]}):'
    f" arrays.k.blake3: '{old_k}' != '{new_k}';"
    f" arrays.k.chunk_blake3.1: '{old[1]}' != '{new[1]}'. To recover: `verify(key)` the"
    ' stored block, `quarantine(key)` it if it is the wrong one (it is moved aside, not'
    ' deleted), then `put` the right block again'
  )
  _assert_same_block(store.get(key), block)


def test_put_onto_a_damaged_block_is_refused(store):
  key = store.put(make_block(0))
  os.truncate(os.path.join(store.root, key, _CHUNK), 0)

  with pytest.raises(store_lib.CorruptBlockError, match="array 'k'"):
    store.put(make_block(0))


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_same_block_gives_byte_identical_files(tmp_path, dtype):
  first = store_lib.BlockStore(tmp_path / 'first')
  second = store_lib.BlockStore(tmp_path / 'second')
  key = first.put(make_block(3, dtype))
  assert second.put(make_block(3, dtype)) == key
  block_dirs = [os.path.join(s.root, key) for s in (first, second)]

  files = [
    sorted(
      os.path.relpath(os.path.join(d, f), block_dir)
      for d, _, names in os.walk(block_dir)
      for f in names
    )
    for block_dir in block_dirs
  ]
  assert (
    files[0]
    == files[1]
    == [
      'k/c.0.0.0.0',
      'k/c.1.0.0.0',
      'k/c.2.0.0.0',
      'k/zarr.json',
      'manifest.json',
      'positions/c.0',
      'positions/zarr.json',
      'v/c.0.0.0.0',
      'v/c.1.0.0.0',
      'v/c.2.0.0.0',
      'v/zarr.json',
    ]
  )
  for name in files[0]:
    contents = [open(os.path.join(d, name), 'rb').read() for d in block_dirs]
    assert contents[0] == contents[1], name
  assert store_lib.digest_tree(block_dirs[0]) == (store_lib.digest_tree(block_dirs[1]))


def test_digest_tree_sees_a_changed_file(store):
  key = store.put(make_block(0))
  before = store_lib.digest_tree(os.path.join(store.root, key))
  with open(os.path.join(store.root, key, 'k', 'zarr.json'), 'a') as f:
    f.write(' ')

  assert store_lib.digest_tree(os.path.join(store.root, key)) != before


def test_delete(store):
  kept = store.put(make_block(1))
  key = store.put(make_block(0))

  store.delete(key)

  assert store.list() == [kept]
  assert key not in store
  with pytest.raises(store_lib.MissingBlockError, match=f'{key}: no such block'):
    store.get(key)
  with pytest.raises(store_lib.MissingBlockError, match=f'{key}: no such block'):
    store.delete(key)
  assert not os.listdir(os.path.join(store.root, '.tmp'))
  assert store.put(make_block(0)) == key
  store.verify(key)


def test_a_deletion_held_after_its_rename_never_removes_a_later_put(store, monkeypatch):
  """On `file` a deletion renames the block into `.tmp/` (gone from view at once) and then
  removes it there: a put of the key meanwhile lands in place, and stays."""
  key = store.put(make_block(0))
  renamed, release = threading.Event(), threading.Event()
  rmtree = shutil.rmtree

  def held(path, *args, **kwargs):
    if str(path).endswith('.del'):  # the deletion's trash
      renamed.set()
      release.wait(timeout=60)
    rmtree(path, *args, **kwargs)

  monkeypatch.setattr(shutil, 'rmtree', held)
  deleter = threading.Thread(target=store.delete, args=(key,))
  deleter.start()
  assert renamed.wait(timeout=60)
  assert key not in store

  again = dataclasses.replace(make_block(1), meta=make_block(0).meta)
  assert store.put(again) == key
  release.set()
  deleter.join(timeout=60)

  assert store.list() == [key]
  _assert_same_block(store.get(key), again)
  store.verify(key)


def test_gc_removes_what_a_crashed_deposit_left(store):
  crashed = os.path.join(store.root, '.tmp', f'{"c" * 64}.deadbeef')
  os.makedirs(os.path.join(crashed, 'k'))

  assert store.gc() == 1

  assert not os.listdir(os.path.join(store.root, '.tmp'))


def test_next_put_removes_what_a_crashed_deposit_left(store):
  crashed = os.path.join(store.root, '.tmp', f'{"c" * 64}.deadbeef')
  os.makedirs(os.path.join(crashed, 'k'))

  key = store.put(make_block(0))

  assert not os.listdir(os.path.join(store.root, '.tmp'))
  assert store.list() == [key]


def test_failed_deposit_leaves_nothing_visible(store, monkeypatch):
  write_files = store_kvstore.write_files

  def write_one_then_fail(kv, files):
    write_files(kv, dict(list(files.items())[:1]))
    raise OSError('disk full')

  monkeypatch.setattr(store_kvstore, 'write_files', write_one_then_fail)

  with pytest.raises(store_lib.StoreIOError, match='cannot deposit the block: disk full'):
    store.put(make_block(0))
  assert not store.list()
  assert store_lib.key_for(make_block(0).meta) not in store
  assert not os.listdir(os.path.join(store.root, '.tmp'))


@pytest.mark.parametrize('winner_seed', [0, 1])
def test_loser_of_a_race_on_one_key_verifies_the_winner(store, monkeypatch, winner_seed):
  """Another writer publishes the same key just before our rename."""
  mine = make_block(0)
  winner = make_block(winner_seed)
  winner = dataclasses.replace(winner, meta=mine.meta)
  rival = store_lib.BlockStore(store.root)
  rename = store_files.rename_unless_taken
  raced = []

  def rival_first(source, target):
    if not raced:
      raced.append(True)
      rival.put(winner)
    return rename(source, target)

  monkeypatch.setattr(store_files, 'rename_unless_taken', rival_first)

  if winner_seed == 0:
    assert store.put(mine) == store_lib.key_for(mine.meta)
  else:
    with pytest.raises(store_lib.ConflictingBlockError, match='arrays.k.blake3'):
      store.put(mine)
  assert raced
  _assert_same_block(store.get(store_lib.key_for(mine.meta)), winner)
  assert not os.listdir(os.path.join(store.root, '.tmp'))


_WORKER = textwrap.dedent("""
    import os, sys, time
    tests_dir, root, worker, go = sys.argv[1:]
    sys.path.insert(0, tests_dir)
    import test_store
    from graftjax import store as store_lib
    store = store_lib.BlockStore(root)
    open(go + '.ready' + worker, 'w').close()
    while not os.path.exists(go):
      time.sleep(0.001)
    for seed in test_store.WORKER_SEEDS[int(worker)]:
      store.put(test_store.make_block(seed))
""")


def test_three_processes_depositing_at_once_lose_nothing(store, tmp_path):
  go = str(tmp_path / 'go')
  workers = [
    subprocess.Popen(
      [sys.executable, '-c', _WORKER, os.path.dirname(__file__), store.root, str(worker), go],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for worker in WORKER_SEEDS
  ]
  deadline = time.monotonic() + 120
  while not all(os.path.exists(f'{go}.ready{w}') for w in WORKER_SEEDS):
    assert all(w.poll() is None for w in workers), workers[0].communicate()
    assert time.monotonic() < deadline
    time.sleep(0.01)
  open(go, 'w').close()
  for worker in workers:
    _, stderr = worker.communicate(timeout=120)
    assert worker.returncode == 0, stderr

  seeds = sorted(set().union(*WORKER_SEEDS.values()))
  want = {store_lib.key_for(make_block(s).meta): make_block(s) for s in seeds}
  assert store.list() == sorted(want)
  for key, block in want.items():
    _assert_same_block(store.get(key), block)
  assert not os.listdir(os.path.join(store.root, '.tmp'))


def test_documented_snippet_reads_a_block_with_tensorstore_alone(store):
  block = make_block(0, 'bfloat16')
  key = store.put(block)
  doc = (pathlib.Path(__file__).parents[3] / 'docs' / 'store_format.md').read_text()
  section = doc[doc.index('## Reading a block with nothing but tensorstore') :]
  snippet = section[section.index('```python') + len('```python') : section.index('```\n\n')]
  scope = {'root': store.root, 'key': key}

  exec(textwrap.dedent(snippet), scope)

  assert scope['manifest']['meta'] == block.meta.to_json()
  got = store.get(key)
  for name, want in (('k', block.k), ('v', block.v)):
    assert scope[name].dtype == got.arrays()[name].dtype
    np.testing.assert_array_equal(_bits(scope[name]), _bits(want))
    np.testing.assert_array_equal(_bits(scope[name]), _bits(got.arrays()[name]))
  np.testing.assert_array_equal(scope['positions'], block.positions)


def _with_meta(block, **changes):
  return dataclasses.replace(block, meta=dataclasses.replace(block.meta, **changes))


def _empty_block():
  empty = np.zeros((2, 0, 1, 4), np.float32)
  return blocks.KVBlock(
    k=empty,
    v=empty,
    positions=np.zeros((0,), np.int32),
    meta=dataclasses.replace(make_block(0).meta, token_ids=()),
  )


@pytest.mark.parametrize(
  'make, message',
  [
    (_empty_block, 'cannot store an empty block'),
    (lambda: _with_meta(make_block(0), dtype='float16'), "cannot store k/v of dtype 'float16'"),
    (
      lambda: _with_meta(make_block(0), dtype='bfloat16'),
      "arrays.k.dtype is 'float32', expected 'bfloat16'",
    ),
  ],
)
def test_unstorable_blocks_are_refused(store, make, message):
  with pytest.raises(store_lib.StoreError, match=message):
    store.put(make())
  assert not store.list()


def test_map_threads_calls_after_in_order_once_each_prefix_ended():
  ended, seen = [], []

  def work(i):
    time.sleep(0.01 * (5 - i))  # later items end first
    ended.append(i)
    return i * i

  after = {1: lambda: seen.append((1, sorted(ended))), 4: lambda: seen.append((4, sorted(ended)))}
  assert store_chunks.map_threads(work, range(5), after=after) == [0, 1, 4, 9, 16]
  assert [i for i, _ in seen] == [1, 4]
  assert set(seen[0][1]) >= {0, 1} and seen[1][1] == [0, 1, 2, 3, 4]


def test_map_threads_runs_at_most_threads_at_once():
  running, peak = [0], [0]
  lock = threading.Lock()

  def work(i):
    with lock:
      running[0] += 1
      peak[0] = max(peak[0], running[0])
    time.sleep(0.02)
    with lock:
      running[0] -= 1
    return -i

  assert store_chunks.map_threads(work, range(6), threads=2) == [0, -1, -2, -3, -4, -5]
  assert peak[0] == 2


def test_map_threads_after_an_error_calls_no_later_after_and_raises_once_all_ended():
  ended, seen = [], []

  def work(i):
    if i == 1:
      raise ValueError('item 1')
    time.sleep(0.02)
    ended.append(i)

  after = {0: lambda: seen.append(0), 2: lambda: seen.append(2)}
  with pytest.raises(ValueError, match='item 1'):
    store_chunks.map_threads(work, range(4), after=after)
  assert 2 not in seen and sorted(ended) == [0, 2, 3]
