"""Writers, deleters and a lying server racing on one key of an object store (S3, GCS).

Each race is made to happen, not hoped for: one party's store reaches the server through
`FaultyProxy`, which holds its requests of one kind until the test releases them, while
another party completes. A writer never writes or deletes bytes another writer's manifest
names; a deletion removes only the block it read; the writer that loses says so and leaves
nothing `gc` cannot reclaim.
"""

import dataclasses
import json
import random
import threading
import time

import pytest
from store_servers import (  # noqa: F401  (the fixtures s3_server, gcs_server, bucket)
  BUCKET,
  bucket_fixture,
  gcs_server,
  s3_server,
  unique_path,
)
from test_store import _assert_same_block, make_block

from graftjax import store as store_lib
from graftjax.store import commit as store_commit
from graftjax.store import manifest as store_manifest

# Every test here starts a server.
pytestmark = pytest.mark.subprocess

_MANIFEST = store_lib.MANIFEST


def _rival(block):
  """Another payload under `block`'s key: what another kernel or device may compute."""
  return dataclasses.replace(make_block(block.meta.start + 100), meta=block.meta)


def _objects(store, key):
  """The names of every object under `<key>/`."""
  return sorted(n.decode() for n in (store._kv / f'{key}/').list().result())


def _committed(store, key):
  """manifest.json and the payload it names: every object a committed block may have."""
  data = json.loads(store._kv.read(f'{key}/{_MANIFEST}').result().value)['data']
  payload = sorted(n.decode() for n in (store._kv / f'{key}/{data}/').list().result())
  return sorted([_MANIFEST, *(f'{data}/{name}' for name in payload)])


def _in_thread(call):
  """Starts `call()` on a thread; returns (thread, outcome: ['returned' or 'raised', value])."""
  outcome = []

  def run():
    try:
      outcome.extend(['returned', call()])
    except Exception as e:  # noqa: BLE001  (looked at by the test)
      outcome.extend(['raised', e])

  thread = threading.Thread(target=run)
  thread.start()
  return thread, outcome


def _held(proxy, thread):
  assert proxy.faults.holding.wait(timeout=60), 'the held request never came'
  assert thread.is_alive()


def _chunk_write(method, name):
  return method in ('PUT', 'POST') and '/k/c.' in name


def _payload_delete(method, name):
  return method == 'DELETE' and '/k/c.' in name


def _manifest_delete(method, name):
  """A deletion of a manifest; on S3 tensorstore checks its condition with a HEAD first."""
  return method in ('DELETE', 'HEAD') and name.endswith(_MANIFEST)


@pytest.mark.parametrize('same', [False, True], ids=['other_payload', 'same_payload'])
def test_a_writer_slower_than_another_of_the_same_key_never_touches_its_block(bucket, same):
  """Writer A's chunks are held; B deposits the key and returns; then A's chunks land.

  Before, A's chunks landed over B's block (under `<key>/`): it then failed its digests
  (CorruptBlockError) until someone quarantined it. Now A's chunks land under A's own
  prefix, A's manifest loses, and A says so: ConflictingBlockError naming both payloads'
  digests, or (the same payload) the key, deduplicated. A leaves nothing behind.
  """
  path = unique_path()
  ours = make_block(0)
  theirs = ours if same else _rival(ours)
  slow_proxy = bucket.proxy()
  slow_proxy.faults.hold = _chunk_write
  slow, fast = bucket.store(path, slow_proxy), bucket.store(path)
  thread, outcome = _in_thread(lambda: slow.put(ours))
  _held(slow_proxy, thread)

  key = fast.put(theirs)
  slow_proxy.faults.release.set()
  thread.join(timeout=120)

  _assert_same_block(fast.get(key), theirs)
  fast.verify(key)
  if same:
    assert outcome == ['returned', key]
  else:
    assert outcome[0] == 'raised' and isinstance(outcome[1], store_lib.ConflictingBlockError)
    both = f'(stored {_digest_alone(bucket, theirs)} != new {_digest_alone(bucket, ours)})'
    assert both in str(outcome[1]) and key in str(outcome[1])
  assert _objects(fast, key) == _committed(fast, key)  # the loser's payload is gone
  assert fast.gc(grace_seconds=0) == 0


def _digest_alone(bucket, block):
  """The payload digest of `block` stored alone."""
  store = bucket.store(unique_path())
  return store_manifest.payload_digest(store._read(store.put(block))[0])


@pytest.mark.parametrize('how', ['delete', 'quarantine'])
def test_a_deletion_held_before_the_payload_never_removes_a_later_put(bucket, how):
  """The deletion removed the manifest and is held before the payload; a writer puts the
  key again and returns; then the deletion goes on. Before, it deleted the new block's
  chunks (`<key>/` held both): a listed block that never read again. Now it deletes only
  the payload its manifest named."""
  path = unique_path()
  block = make_block(0)
  writer = bucket.store(path)
  key = writer.put(block)
  deleter_proxy = bucket.proxy()
  deleter_proxy.faults.hold = _payload_delete
  deleter = bucket.store(path, deleter_proxy)
  thread, outcome = _in_thread(lambda: getattr(deleter, how)(key))
  _held(deleter_proxy, thread)
  assert key not in writer

  again = _rival(block)
  assert writer.put(again) == key
  deleter_proxy.faults.release.set()
  thread.join(timeout=120)

  assert outcome[0] == 'returned', outcome
  assert writer.list() == [key]
  _assert_same_block(writer.get(key), again)
  writer.verify(key)
  assert _objects(writer, key) == _committed(writer, key)


@pytest.mark.parametrize('how', ['delete', 'quarantine'])
def test_a_deletion_of_a_block_replaced_meanwhile_deletes_nothing(bucket, how):
  """The deletion read the manifest and is held before removing it; meanwhile another
  deletes the key and a writer puts it again. Before, the held deletion then removed the
  new block. Now its removal is conditional on the generation it read: it deletes nothing
  and raises ReplacedBlockError."""
  path = unique_path()
  block = make_block(0)
  writer = bucket.store(path)
  key = writer.put(block)
  deleter_proxy = bucket.proxy()
  deleter_proxy.faults.hold = _manifest_delete
  deleter = bucket.store(path, deleter_proxy)
  thread, outcome = _in_thread(lambda: getattr(deleter, how)(key))
  _held(deleter_proxy, thread)

  writer.delete(key)
  again = _rival(block)
  assert writer.put(again) == key
  deleter_proxy.faults.release.set()
  thread.join(timeout=120)

  assert outcome[0] == 'raised', outcome
  assert isinstance(outcome[1], store_lib.ReplacedBlockError), outcome
  assert 'put again' in str(outcome[1])
  _assert_same_block(writer.get(key), again)
  writer.verify(key)
  assert _objects(writer, key) == _committed(writer, key)
  assert not [n for n in writer._kv.list().result() if n.startswith(b'.quarantine/')]


def test_a_chunk_the_server_acknowledged_but_never_stored_commits_nothing(bucket):
  """Before, the manifest was written over a payload missing a chunk: a listed block that
  never read. Now the payload is read back before the manifest is written."""
  path = unique_path()
  proxy = bucket.proxy()
  proxy.faults.drop = lambda method, name: name.endswith('/k/c.1.0.0.0')
  store = bucket.store(path, proxy)
  block = make_block(0)
  key = store_lib.key_for(block.meta)

  with pytest.raises(store_lib.StoreIOError, match='acknowledged a write it did not keep'):
    store.put(block)

  assert proxy.faults.dropped
  assert store.list() == [] and key not in store
  assert _objects(store, key) == []  # its staged payload deleted
  proxy.faults.drop = None
  assert store.put(block) == key
  _assert_same_block(store.get(key), block)


def test_gc_reclaims_what_a_dead_writer_staged_and_keeps_what_a_manifest_names(bucket):
  path = unique_path()
  store = bucket.store(path)
  block = make_block(0)
  key = store.put(block)
  committed = _committed(store, key)
  old = f'{key}/1000000000-{"0" * 32}/'  # staged in 2001 by a writer that died
  young = f'{key}/{store_manifest.new_data_id()}/'  # a deposit in progress
  for prefix in (old, young):
    store._kv.write(f'{prefix}k/c.0.0.0.0', b'left').result()

  assert store.gc() == 1
  assert _objects(store, key) == sorted([*committed, f'{young.split("/")[1]}/k/c.0.0.0.0'])
  assert store.gc(grace_seconds=0) == 1
  assert _objects(store, key) == committed
  _assert_same_block(store.get(key), block)


# The stress test: writers and deleters on a few keys, each key with two payloads.
_KEYS, _WRITERS, _DELETERS, _SECONDS, _GRACE = 6, 4, 2, 4.0, 2.0


@pytest.mark.slow
def test_writers_and_deleters_on_random_keys_lose_no_returned_put(bucket):
  """For `_SECONDS`, `_WRITERS` threads put one of two payloads of a random key and read it
  back at once, `_DELETERS` delete random keys, and a collection with a short grace
  (`_GRACE`) runs again and again. A put that returned reads back exact unless a deletion
  of its key overlapped the put and the read (then the key may be gone, or deleted and put
  again with the other payload); a put refused for a deposit older than half the
  collection's grace commits nothing; nothing ever reads corrupt; at the end every listed
  block verifies and holds one writer's payload, and once collected, the store holds
  nothing but committed blocks."""
  path = unique_path()
  payloads = {i: (make_block(i), _rival(make_block(i))) for i in range(_KEYS)}
  keys = {i: store_lib.key_for(payloads[i][0].meta) for i in range(_KEYS)}
  checks, deletions, errors, collections = [], [], [], []
  clock = time.monotonic
  stop = clock() + _SECONDS

  def writer(seed):
    store, rng = bucket.store(path), random.Random(seed)
    while clock() < stop:
      i, which = rng.randrange(_KEYS), rng.randrange(2)
      start = clock()
      try:
        key = store.put(payloads[i][which])
      except store_lib.ConflictingBlockError:
        continue  # the key holds the other payload
      except store_lib.StoreIOError as e:
        if 'deleted by another writer each time' not in str(e) and 'more than half' not in str(e):
          raise
        continue
      try:
        _assert_same_block(store.get(key), payloads[i][which])
        outcome = 'exact'
      except AssertionError:
        outcome = 'other payload'
      except store_lib.MissingBlockError:
        outcome = 'missing'
      checks.append((i, start, clock(), outcome))

  def deleter(seed):
    store, rng = bucket.store(path), random.Random(seed)
    while clock() < stop:
      i = rng.randrange(_KEYS)
      start = clock()
      try:
        store.delete(keys[i])
      except (store_lib.MissingBlockError, store_lib.ReplacedBlockError):
        pass
      deletions.append((i, start, clock()))
      time.sleep(rng.uniform(0.1, 0.6))

  def collector(seed):
    store, rng = bucket.store(path), random.Random(seed)
    while clock() < stop:
      collections.append(store.gc(grace_seconds=_GRACE))
      time.sleep(rng.uniform(0.1, 0.5))

  def guarded(work, seed):
    try:
      work(seed)
    except Exception as e:  # noqa: BLE001  (asserted empty below)
      errors.append(repr(e))

  threads = [threading.Thread(target=guarded, args=(writer, s)) for s in range(_WRITERS)]
  threads += [threading.Thread(target=guarded, args=(deleter, 100 + s)) for s in range(_DELETERS)]
  threads.append(threading.Thread(target=guarded, args=(collector, 200)))
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(timeout=_SECONDS + 120)

  assert not errors, errors
  overlapped = lambda i, start, end: any(
    d == i and d_start < end and d_end > start for d, d_start, d_end in deletions
  )
  unexcused = [c for c in checks if c[3] != 'exact' and not overlapped(*c[:3])]
  assert not unexcused, unexcused
  assert [c for c in checks if not overlapped(*c[:3])], (checks, deletions)
  assert deletions and collections and [c for c in checks if c[3] == 'exact']
  store = bucket.store(path)
  for i, key in keys.items():
    if key in store.list():
      store.verify(key)
      got = store.get(key)
      assert any(_same(got, payload) for payload in payloads[i])
  store.gc(grace_seconds=0)
  names = sorted(n.decode() for n in store._kv.list().result())
  assert names == sorted(f'{key}/{name}' for key in store.list() for name in _committed(store, key))


def _same(got, want):
  try:
    _assert_same_block(got, want)
  except AssertionError:
    return False
  return True


def test_a_manifest_write_whose_answer_is_lost_and_retried_is_still_committed(bucket):
  """The server stores the manifest and its answer is lost; the store's retry then finds
  a manifest there (its own) and the condition fails. The deposit reads the manifest and
  finds it is its own: it keeps its payload and returns (deleting it as a loser would
  leave a listed block without one)."""
  path = unique_path()
  proxy = bucket.proxy()
  lost = []

  def first_manifest_write(method, name):
    if method in ('PUT', 'POST') and name.endswith(_MANIFEST) and not lost:
      lost.append(name)
      return True
    return False

  proxy.faults.lose_answer = first_manifest_write
  store = bucket.store(path, proxy)
  block = make_block(0)

  key = store.put(block)

  assert lost
  _assert_same_block(store.get(key), block)
  store.verify(key)
  assert _objects(store, key) == _committed(store, key)


def test_a_deposit_that_staged_for_longer_than_half_the_grace_period_commits_nothing(
  bucket, monkeypatch
):
  """`gc` may collect a prefix older than the grace period: a deposit never commits one
  older than half of it."""
  store = bucket.store(unique_path())
  monkeypatch.setattr(store_commit, 'GRACE_SECONDS', 0.0)
  block = make_block(0)
  with pytest.raises(store_lib.StoreIOError, match='more than half the 0 s'):
    store.put(block)
  key = store_lib.key_for(block.meta)
  assert store.list() == [] and _objects(store, key) == []
  monkeypatch.undo()
  assert store.put(block) == key


@pytest.mark.parametrize('how', ['delete', 'quarantine'])
def test_a_deletion_whose_answer_is_lost_and_retried_still_removes_the_payload(bucket, how):
  """The server deletes the manifest and the answer is lost; the retried request finds it
  gone and its condition fails. The deletion then removes the payload it read all the same
  (no later deposit writes under that prefix) and returns; a quarantine keeps its copy."""
  path = unique_path()
  block = make_block(0)
  key = bucket.store(path).put(block)
  proxy = bucket.proxy()
  lost = []

  def first_manifest_delete(method, name):
    if method == 'DELETE' and name.endswith(_MANIFEST) and not lost:
      lost.append(name)
      return True
    return False

  proxy.faults.lose_answer = first_manifest_delete
  store = bucket.store(path, proxy)

  where = getattr(store, how)(key)

  assert lost
  assert key not in store and _objects(store, key) == []
  if how == 'quarantine':
    copy = where.split(f'{BUCKET}/{path}')[1]
    assert f'{copy}{_MANIFEST}'.encode() in store._kv.list().result()
  assert store.put(block) == key
