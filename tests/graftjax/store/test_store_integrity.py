"""graftjax.store binds a key to what it holds, and opens only paths it means.

`put` refuses a block that is not what its key says (positions other than its
metadata's, non-finite k or v); a key taken by a wrong block is freed by
`quarantine`; valid paths open, a backslash or a block folder is refused.
"""

import dataclasses
import os

import ml_dtypes
import numpy as np
import pytest
from test_store import _assert_same_block, make_block

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.store import values as store_values


@pytest.fixture
def store(tmp_path):
  return store_lib.BlockStore(tmp_path / 'store')


def _stored_keys(store):
  return store.list()


def _with_positions(block, positions):
  return dataclasses.replace(block, positions=np.asarray(positions, np.int32))


_POISONED_POSITIONS = {
  'shifted by 7': lambda p: p + 7,
  'all empty': lambda p: np.full_like(p, -1),
  'reversed': lambda p: p[::-1].copy(),
}


@pytest.mark.parametrize('poison', sorted(_POISONED_POSITIONS))
def test_put_refuses_positions_other_than_its_metadata_and_keeps_the_key_free(store, poison):
  """Before: stored under the true key, and every correct put then conflicted."""
  block = make_block(0)
  bad = _with_positions(block, _POISONED_POSITIONS[poison](np.asarray(block.positions)))

  with pytest.raises(store_lib.InvalidBlockError, match='block positions'):
    store.put(bad)

  assert _stored_keys(store) == []
  key = store.put(block)
  _assert_same_block(store.get(key), block)


def test_put_refuses_positions_of_a_page_other_than_its_metadata(store):
  block = make_block(0)
  bad = _with_positions(block, np.asarray(block.positions) + 7)
  layout = ((0, 3), (1, 3), (1, 3))

  with pytest.raises(store_lib.InvalidBlockError, match='positions start at 12'):
    store.put(bad, page_layout=layout)
  store.put(block, page_layout=layout)


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('value', [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize('name', ['k', 'v'])
def test_put_refuses_a_non_finite_key_or_value_naming_where(store, dtype, value, name):
  """Before: NaN and infinities were stored, and grafted: one NaN turns every logit NaN."""
  block = make_block(0, dtype)
  array = np.array(getattr(block, name))
  array[2, 1, 0, 3] = value
  bad = dataclasses.replace(block, **{name: array})

  with pytest.raises(store_lib.InvalidBlockError, match=rf'{name}\[2, 1, 0, 3\] is -?(nan|inf)'):
    store.put(bad)
  assert _stored_keys(store) == []


def test_put_of_a_page_checks_only_the_rows_it_keeps(store):
  block = make_block(0)
  k = np.array(block.k)
  k[1, 0, 0, 0] = np.nan  # layer 1 of the page keeps rows [1, 3): row 0 is not stored
  nan_in_row_0 = dataclasses.replace(block, k=k)

  key = store.put(nan_in_row_0, page_layout=((0, 3), (1, 3), (1, 3)))
  store.verify(key)
  with pytest.raises(store_lib.InvalidBlockError, match=r'k\[1, 0, 0, 0\] is nan'):
    store.put(nan_in_row_0)
  with pytest.raises(store_lib.InvalidBlockError, match=r'k\[0, 0, 0, 0\] is nan'):
    store.put(nan_in_row_0, page_layout=((1, 3), (0, 3), (1, 3)))


def test_put_refuses_rows_other_than_its_token_ids(store):
  block = make_block(0)
  meta = block.meta
  bad = dataclasses.replace(block)
  # Past KVBlock's own shape check, as a hostile caller could.
  object.__setattr__(bad, 'meta', dataclasses.replace(meta, token_ids=meta.token_ids[:2]))
  with pytest.raises(store_lib.InvalidBlockError, match='one row per token id'):
    store.put(bad)
  assert _stored_keys(store) == []


def test_first_nonfinite_finds_the_first_in_order():
  arrays = {
    'k': np.zeros((2, 3, 1, 4), np.float32),
    'v': np.zeros((2, 3, 1, 4), ml_dtypes.bfloat16),
    'positions': np.array([-1, 0, 1], np.int32),
  }
  assert store_values.first_nonfinite(arrays) is None
  arrays['v'][1, 2, 0, 3] = np.inf
  arrays['v'][1, 0, 0, 1] = -np.inf
  assert store_values.first_nonfinite(arrays) == 'v[1, 0, 0, 1] is -inf'
  arrays['k'][1, 1, 0, 0] = np.nan
  assert store_values.first_nonfinite(arrays) == 'k[1, 1, 0, 0] is nan'


def _put_unchecked(store, block, monkeypatch):
  """`block` stored as a store without `put`'s positions and finiteness checks stored it."""
  with monkeypatch.context() as m:
    m.setattr(blocks, 'check_positions', lambda *args: None)
    m.setattr(store_values, 'first_nonfinite', lambda arrays: None)
    return store.put(block)


def test_a_key_taken_by_a_block_with_wrong_positions_is_freed_by_quarantine(store, monkeypatch):
  """Before: `get` returned the wrong positions, and no operation freed the key."""
  block = make_block(0)
  key = _put_unchecked(store, _with_positions(block, np.asarray(block.positions) + 7), monkeypatch)

  with pytest.raises(store_lib.CorruptBlockError, match='positions start at 12'):
    store.get(key)
  with pytest.raises(store_lib.CorruptBlockError, match='positions start at 12'):
    store.verify(key)
  with pytest.raises(store_lib.CorruptBlockError, match=r'quarantine\(key\)'):
    store.put(block)

  moved = store.quarantine(key)

  assert os.path.dirname(moved) == os.path.join(store.root, '.quarantine')
  assert os.path.basename(moved).startswith(f'{key}.')
  assert key not in store and store.list() == []
  assert store.put(block) == key
  _assert_same_block(store.get(key), block)
  assert store.gc() == 0 and os.path.isdir(moved)  # set aside, not collected


def test_verify_reports_a_stored_non_finite_value_and_quarantine_frees_it(store, monkeypatch):
  block = make_block(0)
  v = np.array(block.v)
  v[0, 2, 0, 1] = np.nan
  key = _put_unchecked(store, dataclasses.replace(block, v=v), monkeypatch)

  with pytest.raises(store_lib.CorruptBlockError, match=r'v\[0, 2, 0, 1\] is nan'):
    store.verify(key)
  with pytest.raises(store_lib.ConflictingBlockError, match=r'verify\(key\).*quarantine\(key\)'):
    store.put(block)

  store.quarantine(key)
  assert store.put(block) == key
  store.verify(key)


def test_quarantine_on_another_kvstore_copies_then_deletes():
  store = store_lib.BlockStore('memory://quarantined/')
  block = make_block(1)
  key = store.put(block)

  moved = store.quarantine(key)

  assert moved.startswith(f'memory://quarantined/.quarantine/{key}.')
  assert key not in store and store.list() == []
  prefix = moved.removeprefix('memory://quarantined/').encode()
  names = store._kv.list().result()
  assert prefix + store_lib.MANIFEST.encode() in names
  store.put(block)
  _assert_same_block(store.get(key), block)


def test_quarantine_refuses_a_missing_key_and_a_read_only_store(store):
  key = store.put(make_block(0))
  with pytest.raises(store_lib.MissingBlockError, match='no such block'):
    store.quarantine('0' * 64)
  with pytest.raises(store_lib.InvalidKeyError):
    store.quarantine('../x')
  with pytest.raises(store_lib.ReadOnlyStoreError):
    store_lib.BlockStore(store.root, read_only=True).quarantine(key)
  assert store.list() == [key]


@pytest.mark.parametrize('path', ['./x', '.', 'a//b', 'a/../b', 'a/./b/', 'ABS/a/../c'])
def test_valid_paths_open_the_directory_they_name(tmp_path, monkeypatch, path):
  """Before: tensorstore's file driver refused each of these."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / 'a').mkdir()
  path = path.replace('ABS', str(tmp_path))
  expected = os.path.normpath(os.path.join(tmp_path, path))

  store = store_lib.BlockStore(path)
  key = store.put(make_block(0))

  assert store.root == expected
  assert os.path.isfile(os.path.join(expected, key, store_lib.MANIFEST))


def test_a_backslash_in_a_path_is_refused_not_written_elsewhere(tmp_path, monkeypatch):
  """Before: 'a\\b' opened (and wrote to) a/b."""
  monkeypatch.chdir(tmp_path)
  for root in ['a\\b', str(tmp_path / 'a\\b'), {'driver': 'file', 'path': 'a\\b'}]:
    with pytest.raises(store_lib.UnsafePathError, match='backslash'):
      store_lib.BlockStore(root)
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('inside', ['{key}', '{key}/sub', '{key}/k', '.tmp/{key}.x'])
def test_a_store_inside_a_block_folder_is_refused(store, inside):
  """Before: a store was made (and written) inside another store's block."""
  key = store.put(make_block(0))
  if inside.startswith('.tmp'):
    os.makedirs(os.path.join(store.root, '.tmp', f'{key}.x'))
    open(os.path.join(store.root, '.tmp', f'{key}.x', store_lib.MANIFEST), 'w').close()
  root = os.path.join(store.root, inside.format(key=key))

  with pytest.raises(store_lib.UnsafePathError, match='block folder'):
    store_lib.BlockStore(root)
  with pytest.raises(store_lib.UnsafePathError, match='block folder'):
    store_lib.BlockStore(root, read_only=True)
  store.verify(key)


@pytest.mark.parametrize('inside', ['.tmp', '.tmp/x', '.quarantine/y'])
def test_a_store_inside_the_staging_or_quarantine_of_a_store_is_refused(store, inside):
  """`gc` clears `.tmp/`: a store there would lose its blocks."""
  store.put(make_block(0))
  with pytest.raises(store_lib.UnsafePathError, match=r'the \.(tmp|quarantine) folder of a store'):
    store_lib.BlockStore(os.path.join(store.root, inside))


def test_a_store_named_as_a_key_in_a_store_is_refused(store):
  """It would take the folder of the block of that key, deposited later."""
  store.put(make_block(0))
  with pytest.raises(store_lib.UnsafePathError, match='block folder'):
    store_lib.BlockStore(os.path.join(store.root, 'a' * 64))


def test_a_folder_that_merely_holds_a_manifest_json_is_not_a_block(tmp_path):
  (tmp_path / 'project').mkdir()
  (tmp_path / 'project' / store_lib.MANIFEST).write_text('{}')
  store = store_lib.BlockStore(tmp_path / 'project' / 'blocks')
  store.put(make_block(0))


def test_a_path_like_of_bytes_is_a_store_error():
  class BytesPath:
    def __fspath__(self):
      return b'/tmp/x'

  with pytest.raises(store_lib.StoreIOError, match='must be a str'):
    store_lib.BlockStore(BytesPath())
