"""The commit protocol on object stores: the manifest, written last, makes a block visible.

A writer killed mid-put (the process, or the server under it) leaves nothing that lists
or reads; writers racing on one key leave one verified block; a read racing a delete
gives MissingBlockError, never other bytes.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from store_servers import (  # noqa: F401  (the fixtures s3_server, gcs_server)
  BUCKET,
  Server,
  environment,
  fake_gcs_server,
  gcs_server,
  gcs_spec,
  s3_server,
  s3_spec,
  unique_path,
)
from test_store import _assert_same_block, make_block

from graftjax import store as store_lib
from graftjax.store import kvstore as store_kvstore
from graftjax.store import read as store_read

# Every test here starts a server or a writer process.
pytestmark = pytest.mark.subprocess


def _spec(request, tmp_path, name, path=None):
  path = path or unique_path()
  if name == 'file':
    return str(tmp_path / path)
  if name == 's3':
    return s3_spec(request.getfixturevalue('s3_server').url, path)
  request.getfixturevalue('gcs_server')
  return gcs_spec(path)


@pytest.fixture(params=['file', 's3', 'gcs'])
def spec(request, tmp_path):
  """A fresh store's root (a directory or a tensorstore spec), one per backend."""
  return _spec(request, tmp_path, request.param)


_KILLED_WRITER = textwrap.dedent("""
    import json, os, signal, sys
    tests_dir, spec = sys.argv[1:]
    sys.path.insert(0, tests_dir)
    import test_store
    from graftjax import store as store_lib
    from graftjax.store import kvstore as store_kvstore
    write_files = store_kvstore.write_files

    def payload_then_die(kv, files):
      write_files(kv, files)
      # After the payload: on an object store before the manifest, on `file` before the
      # staged folder is renamed into place.
      os.kill(os.getpid(), signal.SIGKILL)

    store_kvstore.write_files = payload_then_die
    store_lib.BlockStore(json.loads(spec)).put(test_store.make_block(0))
""")


def test_writer_killed_between_payload_and_manifest_leaves_no_block(spec):
  store = store_lib.BlockStore(spec)
  key = store_lib.key_for(make_block(0).meta)
  writer = subprocess.run(
    [sys.executable, '-c', _KILLED_WRITER, os.path.dirname(__file__), json.dumps(spec)],
    capture_output=True,
    timeout=120,
    check=False,
  )

  assert writer.returncode == -signal.SIGKILL, writer.stderr.decode()
  assert store.list() == []
  assert key not in store
  with pytest.raises(store_lib.MissingBlockError, match=key):
    store.get(key)
  assert store.put(make_block(0)) == key
  _assert_same_block(store.get(key), make_block(0))
  # On an object store the dead writer's prefix, which no manifest names, is collected
  # (on `file` the next deposit cleared `.tmp/`).
  assert store.gc(grace_seconds=0) == (0 if isinstance(spec, str) else 1)
  assert store.gc(grace_seconds=0) == 0
  _assert_same_block(store.get(key), make_block(0))


def test_server_killed_mid_put_leaves_no_block_after_it_restarts(tmp_path, monkeypatch):
  """A GCS server on disk dies after the payload; restarted, it holds no block."""
  server = fake_gcs_server()
  data = tmp_path / 'gcs-data'
  persistent = [c if c != 'memory' else 'filesystem' for c in server.command]
  server.command = persistent + ['-filesystem-root', str(data)]
  env = {'TENSORSTORE_GCS_HTTP_URL': server.url, 'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'test'}
  env['GCE_METADATA_ROOT'] = '127.0.0.1:1'
  retries = {'gcs_request_retries': {'max_retries': 2, 'initial_delay': '0.01s'}}
  spec = gcs_spec('stores/killed/', context=retries)
  write_files = store_kvstore.write_files

  def payload_then_server_dies(kv, files):
    write_files(kv, files)
    if 'manifest.json' not in files:
      server.stop()

  with environment(env):
    server.start()
    try:
      server.request('POST', '/storage/v1/b', {'name': BUCKET})
      monkeypatch.setattr(store_kvstore, 'write_files', payload_then_server_dies)
      with pytest.raises(store_lib.StoreIOError, match='cannot deposit the block'):
        store_lib.BlockStore(spec).put(make_block(0))
      monkeypatch.setattr(store_kvstore, 'write_files', write_files)
      server.start()
      store = store_lib.BlockStore(spec)
      key = store_lib.key_for(make_block(0).meta)
      assert any(store._kv.list().result()), 'the payload outlived the server'
      assert store.list() == []
      with pytest.raises(store_lib.MissingBlockError, match=key):
        store.get(key)
      assert store.put(make_block(0)) == key
      _assert_same_block(store.get(key), make_block(0))
    finally:
      server.stop()


_RACER = textwrap.dedent("""
    import json, os, sys, time
    tests_dir, spec, go = sys.argv[1:]
    sys.path.insert(0, tests_dir)
    import test_store
    from graftjax import store as store_lib
    store = store_lib.BlockStore(json.loads(spec))
    blocks = [test_store.make_block(seed) for seed in range(6)]
    open(go + '.ready' + str(os.getpid()), 'w').close()
    while not os.path.exists(go):
      time.sleep(0.001)
    for block in blocks:
      store.put(block)
""")


def test_two_processes_putting_the_same_keys_at_once_leave_verified_blocks(spec, tmp_path):
  go = str(tmp_path / 'go')
  racers = [
    subprocess.Popen(
      [sys.executable, '-c', _RACER, os.path.dirname(__file__), json.dumps(spec), go],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
    )
    for _ in range(2)
  ]
  deadline = time.monotonic() + 120
  while not all(os.path.exists(f'{go}.ready{r.pid}') for r in racers):
    assert all(r.poll() is None for r in racers), racers[0].communicate()
    assert time.monotonic() < deadline
    time.sleep(0.01)
  open(go, 'w').close()
  for racer in racers:
    _, stderr = racer.communicate(timeout=120)
    assert racer.returncode == 0, stderr.decode()

  store = store_lib.BlockStore(spec)
  want = {store_lib.key_for(make_block(s).meta): make_block(s) for s in range(6)}
  assert store.list() == sorted(want)
  for key, block in want.items():
    store.verify(key)
    _assert_same_block(store.get(key), block)


@pytest.fixture(params=['s3', 'gcs'])
def remote_spec(request, tmp_path):
  return _spec(request, tmp_path, request.param)


def test_rival_payload_over_ours_before_our_manifest_leaves_one_verified_block(
  remote_spec, monkeypatch
):
  """A rival deposits the key, other bytes, between our payload and our manifest.

  Where the server honours the manifest's condition (S3) the rival's block stays and our
  put names the conflict; where it does not (the GCS emulator) our manifest replaces the
  rival's, and we write our payload again over the rival's. Either way one block
  verifies, and it is exactly one writer's.
  """
  store = store_lib.BlockStore(remote_spec)
  ours = make_block(0)
  rival_block = dataclasses.replace(make_block(1), meta=ours.meta)
  rival = store_lib.BlockStore(remote_spec)
  write_files = store_kvstore.write_files
  raced = []

  def rival_between(kv, files):
    write_files(kv, files)
    if not raced and 'manifest.json' not in files:
      raced.append(True)
      rival.put(rival_block)

  monkeypatch.setattr(store_kvstore, 'write_files', rival_between)
  key = store_lib.key_for(ours.meta)
  try:
    store.put(ours)
    stored_is_ours = True
  except store_lib.ConflictingBlockError:
    stored_is_ours = False

  assert raced
  store.verify(key)
  _assert_same_block(store.get(key), ours if stored_is_ours else rival_block)


def test_read_racing_a_delete_is_missing_never_other_bytes(spec, monkeypatch):
  """The block is deleted after the reader has its manifest, before its chunks."""
  store = store_lib.BlockStore(spec)
  key = store.put(make_block(0))
  deleter = store_lib.BlockStore(spec)
  parse = store_read.store_manifest.parse_manifest
  deleted = []

  def delete_after_the_manifest(*args):
    parsed = parse(*args)
    if not deleted:
      deleted.append(True)
      deleter.delete(key)
    return parsed

  monkeypatch.setattr(store_read.store_manifest, 'parse_manifest', delete_after_the_manifest)

  with pytest.raises(store_lib.MissingBlockError, match=f'{key}: no such block'):
    store.get(key)
  assert deleted


def test_reads_racing_deletes_and_puts_get_the_block_or_missing(spec):
  """A reader thread against a thread deleting and depositing the block again."""
  store = store_lib.BlockStore(spec)
  block = make_block(0)
  key = store.put(block)
  stop = threading.Event()
  errors = []

  def churn():
    try:
      for _ in range(15):
        store.delete(key)
        store.put(block)
    except Exception as e:  # noqa: BLE001  (raised below, on the test's thread)
      errors.append(e)
    finally:
      stop.set()

  churner = threading.Thread(target=churn)
  churner.start()
  outcomes = {'block': 0, 'missing': 0}
  deadline = time.monotonic() + 60
  while not stop.is_set() and time.monotonic() < deadline:
    try:
      _assert_same_block(store.get(key), block)
      outcomes['block'] += 1
    except store_lib.MissingBlockError:
      outcomes['missing'] += 1
  churner.join(timeout=60)

  assert not errors, errors
  assert sum(outcomes.values()) > 0
