"""graftjax.store refuses bad input and failing storage with a StoreError.

Each test here failed on the store as it was before these refusals (commit
1a43625): it accepted the input silently, or let another exception out.
"""

import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading

import numpy as np
import pytest
from test_store import _assert_same_block, make_block

from graftjax import store as store_lib
from graftjax.store import kvstore as store_kvstore
from graftjax.store import manifest as store_manifest
from graftjax.store import read as store_read


@pytest.fixture
def store(tmp_path):
  return store_lib.BlockStore(tmp_path / 'store')


def _set(meta, **fields):
  """`meta` with fields set past BlockMeta's own checks, as a hostile caller could."""
  meta = dataclasses.replace(meta)
  for name, value in fields.items():
    object.__setattr__(meta, name, value)
  return meta


def _nothing_stored(store):
  assert not store.list()
  staging = os.path.join(store.root, '.tmp')
  assert not os.path.exists(staging) or not os.listdir(staging)


@pytest.mark.parametrize(
  'positions, message',
  [
    (np.arange(5, 8, dtype=np.int64) + 2**32, r'position 0 is .*4294967301.*outside int32'),
    (np.arange(5, 8) + 0.5, r'position 0 is .*5\.5.*not an integer'),
    (np.array([5.0, np.nan, 7.0]), 'position 1 is .*nan.*not an integer'),
    (np.array([5, 6, 2**31], np.uint64), 'position 2 is .*outside int32'),
    (np.array([True, False, True]), 'positions must be a 1-D integer array'),
  ],
)
def test_put_refuses_positions_that_are_not_exactly_int32(store, positions, message):
  """Before: int64 2^32+p and float p+0.5 were narrowed to int32 silently."""
  block = dataclasses.replace(make_block(0), positions=positions)

  with pytest.raises(store_lib.InvalidBlockError, match=message):
    store.put(block)
  _nothing_stored(store)


def test_put_keeps_positions_that_are_exact_in_another_dtype(store):
  block = make_block(0)
  wide = dataclasses.replace(block, positions=np.asarray(block.positions, np.float64))

  _assert_same_block(store.get(store.put(wide)), block)


@pytest.mark.parametrize(
  'fields',
  [
    {'start': np.int64(5)},
    {'start': 5.0},
    {'start': True},
    {'start': -1},
    {'start': 2**40},
    {'token_ids': (1, 2, np.int64(3))},
    {'token_ids': (1, 2, '3')},
    {'token_ids': (1, 2, 3.0)},
    {'token_ids': (1, 2, 2**40)},
    {'token_ids': (1, 2, -3)},
    {'dtype': np.dtype('float32')},
    {'model_fingerprint': None},
    {'shift': 0.5},
  ],
)
def test_put_type_checks_every_metadata_field(store, fields):
  """Before: key_for narrowed with int()/str(), json.dumps raised TypeError."""
  block = make_block(0)
  block = dataclasses.replace(block, meta=_set(block.meta, **fields))

  with pytest.raises(store_lib.InvalidBlockError, match='cannot store the block: ') as error:
    store.put(block)
  assert error.value.path == store.root
  _nothing_stored(store)


def _manifest_path(store, key):
  return os.path.join(store.root, key, 'manifest.json')


def _edit_meta(**fields):
  def edit(text):
    manifest = json.loads(text)
    manifest['meta'].update(fields)
    return json.dumps(manifest)

  return edit


@pytest.mark.parametrize(
  'edit, message',
  [
    # Before: TypeError, ValueError, OverflowError from key_for's int().
    (_edit_meta(start=None), "'start'"),
    (_edit_meta(start='x'), "'start'"),
    (_edit_meta(start=float('inf')), "'start'"),
    (_edit_meta(token_ids=[float('inf')] * 3), "'token_ids'"),
    # Before: RecursionError from json.loads.
    (lambda text: '[' * 100_000 + ']' * 100_000, 'nested too deeply'),
    (
      lambda text: text.replace('"meta": {', '"meta": ' + '[' * 50_000 + ']' * 50_000 + ', "x": {'),
      'nested too deeply',
    ),
    # Before: accepted, the last duplicate winning.
    (
      lambda text: text.replace('{', '{"format": "graftjax.blockstore/2", ', 1),
      "duplicate key 'format'",
    ),
    # Before: accepted, start came back as the string '5'.
    (_edit_meta(start='5'), "'start'"),
    # Refused before too, and still named: ints past str's digit limit or int32.
    (lambda text: text.replace('"start": 5', '"start": 1' + '0' * 5000), 'Exceeds the limit'),
    (_edit_meta(start=2**70), "'start'"),
    (
      lambda text: text.replace(
        '"shape": [\n        3,', '"shape": [\n        12345678901234567890,', 1
      ),
      'shape',
    ),
    (lambda text: '[]', 'manifest is \\[\\]: expected a JSON object'),
    (lambda text: text.encode('latin-1').decode('ascii') + '\xe9', 'ascii'),
  ],
)
def test_malformed_manifest_is_a_corrupt_block_naming_path_and_field(store, edit, message):
  key = store.put(make_block(0))
  path = _manifest_path(store, key)
  with open(path, encoding='utf-8') as f:
    text = edit(f.read())
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)

  for read in (store.get, store.verify, lambda _: store.put(make_block(0))):
    with pytest.raises(
      store_lib.CorruptBlockError, match='malformed manifest.json: .*' + message
    ) as error:
      read(key)
    assert error.value.path == os.path.join(store.root, key)


def test_a_manifest_is_parsed_again_only_when_its_bytes_change(store, monkeypatch):
  """The parse memo: read twice, parsed once; the same key with a changed manifest (still
  valid JSON, describing another block) is parsed again and refused."""
  parses = []
  parse = store_manifest._parse_manifest
  monkeypatch.setattr(
    store_manifest, '_parse_manifest', lambda *args: parses.append(args[2]) or parse(*args)
  )
  block = make_block(0)
  key = store.put(block)
  parses.clear()
  for _ in range(2):
    _assert_same_block(store.get(key), block)
  assert parses == []  # parsed when put verified the deposit
  path = _manifest_path(store, key)
  with open(path, encoding='utf-8') as f:
    text = _edit_meta(start=6, capacity=64)(f.read())
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)

  with pytest.raises(store_lib.CorruptBlockError, match='manifest.json describes block '):
    store.get(key)
  assert parses == [key]


def test_parsed_manifests_drop_the_least_recently_used_beyond_their_bytes():
  held = store_manifest._ParsedManifests(max_bytes=10)
  for key in 'abc':
    held.put(key, b'1234', (key, None))
  assert held.get('a', b'1234') is None  # 12 bytes > 10: a dropped
  assert held.get('b', b'1234') == ('b', None)
  held.put('d', b'1234', ('d', None))  # c is now the least recently used
  assert held.get('c', b'1234') is None
  assert held.get('b', b'1234') == ('b', None)
  assert held.get('b', b'12345') is None  # other bytes: not this manifest
  held.clear()
  assert held.get('d', b'1234') is None


def test_root_that_is_a_file_is_refused_by_name(tmp_path):
  """Before: FileExistsError from os.makedirs."""
  root = tmp_path / 'store'
  root.write_text('not a store')

  for read_only in (False, True):
    with pytest.raises(store_lib.StoreIOError, match=f'{root}: the store root is not a directory'):
      store_lib.BlockStore(root, read_only=read_only)
  with pytest.raises(store_lib.StoreIOError, match='cannot create the store'):
    store_lib.BlockStore(root / 'below')
  assert root.read_text() == 'not a store'


def _tamper(root, name, kind, elsewhere):
  path = os.path.join(root, name)
  shutil.rmtree(path, ignore_errors=True)
  if os.path.lexists(path):
    os.unlink(path)
  if kind == 'file':
    with open(path, 'w') as f:
      f.write('x')
  elif kind == 'directory':
    os.mkdir(path)
  elif kind == 'symlink':
    os.symlink(elsewhere, path)
  elif kind == 'fifo':
    os.mkfifo(path)
  return path


@pytest.mark.parametrize(
  'name, kind, cause',
  [
    ('.tmp', 'file', 'the staging directory is not a directory'),
    ('.tmp', 'symlink', 'the staging directory is a symlink'),
    ('.lock', 'directory', 'the store lock is not a regular file'),
    ('.lock', 'symlink', 'the store lock is not a regular file'),
    ('.lock', 'fifo', 'the store lock is not a regular file'),
  ],
)
def test_tampered_staging_or_lock_is_refused_by_name(store, tmp_path, name, kind, cause):
  """Before: FileExistsError (.tmp a file) or IsADirectoryError (.lock a directory)."""
  kept = store.put(make_block(1))
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  path = _tamper(store.root, name, kind, elsewhere)

  reopened = store_lib.BlockStore(store.root)
  for write in (
    lambda: reopened.put(make_block(0)),
    lambda: reopened.delete(kept),
    reopened.gc,
  ):
    with pytest.raises(store_lib.UnsafePathError) as error:
      write()
    assert str(error.value) == f'{path}: {cause}'
  assert reopened.list() == [kept]
  reopened.verify(kept)
  assert not os.listdir(elsewhere)


@pytest.mark.parametrize('where', ['fsync', 'write'])
def test_full_disk_is_a_store_error_and_leaves_nothing(store, monkeypatch, where):
  """Before: the OSError itself escaped put."""
  kept = store.put(make_block(1))
  full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  if where == 'fsync':

    def fsync(fd):
      raise full

    monkeypatch.setattr(os, 'fsync', fsync)
  else:
    write_files = store_kvstore.write_files

    def write_then_fill(kv, files):
      write_files(kv, dict(list(files.items())[:3]))
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store_kvstore, 'write_files', write_then_fill)

  with pytest.raises(store_lib.StoreIOError, match='No space left on device') as error:
    store.put(make_block(0))
  assert error.value.path.startswith(os.path.join(store.root, '.tmp'))
  monkeypatch.undo()
  assert store.list() == [kept]
  assert store_lib.key_for(make_block(0).meta) not in store
  assert not os.listdir(os.path.join(store.root, '.tmp'))


def test_get_of_a_block_deleted_while_it_is_read_is_missing(store, monkeypatch):
  """Deleted after its files were listed. Before: FileNotFoundError."""
  key = store.put(make_block(0))
  listing = store_read._listing

  def list_then_delete(*args):
    files = listing(*args)
    if key in store:
      store.delete(key)
    return files

  monkeypatch.setattr(store_read, '_listing', list_then_delete)

  for read in (store.get, store.verify):
    with pytest.raises(store_lib.MissingBlockError, match=f'{key}: no such block'):
      read(key)


def test_get_racing_delete_and_put_sees_the_block_or_missing(store):
  """Reads on one thread while another deletes and deposits again."""
  block = make_block(0)
  key = store.put(block)
  stop = threading.Event()
  outcomes = {'block': 0, 'missing': 0}
  errors = []

  def churn():
    try:
      while not stop.is_set():
        store.delete(key)
        store.put(block)
    except Exception as e:  # noqa: BLE001
      errors.append(e)

  writer = threading.Thread(target=churn)
  writer.start()
  try:
    for _ in range(300):
      try:
        _assert_same_block(store.get(key), block)
        outcomes['block'] += 1
      except store_lib.MissingBlockError:
        outcomes['missing'] += 1
  finally:
    stop.set()
    writer.join()
  assert not errors
  assert outcomes['missing'] > 0 or outcomes['block'] == 300


def test_read_only_store_is_listed_read_and_verified_without_writing(store):
  """Before: BlockStore had no read-only mode and created .tmp/ on opening."""
  block = make_block(0)
  key = store.put(block)
  root = store_lib.BlockStore(os.path.join(store.root, 'fresh')).root
  before = sorted(os.listdir(store.root))

  reader = store_lib.BlockStore(store.root, read_only=True)

  assert reader.list() == [key]
  _assert_same_block(reader.get(key), block)
  reader.verify(key)
  for write in (lambda: reader.put(make_block(1)), lambda: reader.delete(key), reader.gc):
    with pytest.raises(
      store_lib.ReadOnlyStoreError, match=f'{store.root}: the store was opened read-only'
    ):
      write()
  assert sorted(os.listdir(store.root)) == before
  assert not os.listdir(root)  # opening writes nothing, not even .tmp/
  with pytest.raises(store_lib.StoreIOError, match='no such store'):
    store_lib.BlockStore(os.path.join(store.root, 'absent'), read_only=True)


def test_store_on_storage_that_refuses_writes_reads_and_refuses_put(tmp_path, monkeypatch):
  """Every write syscall fails with EROFS, as on a read-only mount.

  Before: opening the store created .tmp/ and raised OSError(EROFS).
  """
  writer = store_lib.BlockStore(tmp_path / 'store')
  block = make_block(0)
  key = writer.put(block)
  shutil.rmtree(os.path.join(writer.root, '.tmp'))
  os.unlink(os.path.join(writer.root, '.lock'))

  def read_only(name):
    def refuse(*args, **kwargs):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), args[0] if args else None)

    return refuse

  real_open = os.open

  def open_for_reading(path, flags, *args, **kwargs):
    if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
    return real_open(path, flags, *args, **kwargs)

  monkeypatch.setattr(os, 'open', open_for_reading)
  for name in ('mkdir', 'makedirs', 'rename', 'replace', 'unlink', 'rmdir'):
    monkeypatch.setattr(os, name, read_only(name))

  store = store_lib.BlockStore(writer.root)
  assert store.list() == [key]
  _assert_same_block(store.get(key), block)
  store.verify(key)
  with pytest.raises(
    store_lib.ReadOnlyStoreError,
    match=f'{writer.root}/.lock: cannot open the store lock: Read-only file system',
  ):
    store.put(make_block(1))
  with pytest.raises(store_lib.ReadOnlyStoreError, match='Read-only file system'):
    store.delete(key)


_READER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import test_store
    from graftjax import store as store_lib
    store = store_lib.BlockStore(sys.argv[2])
    [key] = store.list()
    test_store._assert_same_block(store.get(key), test_store.make_block(0))
    store.verify(key)
    try:
      store.put(test_store.make_block(1))
    except store_lib.ReadOnlyStoreError as e:
      print('refused:', e)
    else:
      raise SystemExit('put succeeded on a read-only store')
""")


@pytest.mark.parametrize('how', ['read-only bind mount', 'unprivileged user'])
def test_store_on_a_real_read_only_directory(how):
  """The store read where writes really fail: EROFS (a read-only bind mount
  in a private mount namespace) or EACCES (a user without write access; as
  root, chmod alone would not stop writes). Skipped where neither exists."""
  top = tempfile.mkdtemp()  # pytest's tmp_path is closed to other users
  try:
    _read_only_directory(top, how)
  finally:
    shutil.rmtree(top)


def _read_only_directory(top, how):
  os.chmod(top, 0o755)
  store = store_lib.BlockStore(os.path.join(top, 'store'))
  store.put(make_block(0))
  for name in ('.tmp', '.lock'):  # as a store copied without them
    path = os.path.join(store.root, name)
    shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
  tests_dir = os.path.dirname(__file__)
  python = [sys.executable, '-c', _READER, tests_dir, store.root]
  if how == 'read-only bind mount':
    if not shutil.which('unshare'):
      pytest.skip('no unshare(1)')
    root = store.root
    script = f'mount --bind {root} {root} && mount -o remount,bind,ro {root} && exec "$@"'
    command = ['unshare', '-m', 'sh', '-c', script, 'sh', *python]
    expected = 'Read-only file system'
  else:
    if os.geteuid() != 0 or not shutil.which('setpriv'):
      pytest.skip('needs root and setpriv(1) to drop to another user')
    for directory, subdirectories, files in os.walk(store.root):
      os.chmod(directory, 0o555)
      for name in files:
        os.chmod(os.path.join(directory, name), 0o444)
    command = ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', *python]
    expected = 'Permission denied'
  result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
  if how == 'read-only bind mount' and 'mount' in result.stderr and result.returncode:
    pytest.skip(f'no read-only bind mount here: {result.stderr.strip()}')
  assert result.returncode == 0, result.stderr
  assert f'refused: {store.root}/.lock: cannot open the store lock: {expected}' in result.stdout
  assert sorted(os.listdir(store.root)) == [store_lib.key_for(make_block(0).meta)]


def test_manifest_of_another_block_layout_is_unsupported_by_name(store):
  """Before: a ValueError from BlockMeta, reported as a malformed manifest."""
  key = store.put(make_block(0))
  path = _manifest_path(store, key)
  with open(path) as f:
    manifest = json.load(f)
  manifest['meta']['layout_version'] = manifest['layout_version'] = 1
  with open(path, 'w') as f:
    json.dump(manifest, f)

  with pytest.raises(
    store_lib.UnsupportedFormatError,
    match=f'{key}: manifest.json has meta.layout_version 1; this code reads only',
  ):
    store.get(key)
