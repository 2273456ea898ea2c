"""The portable block fixture, moved through an object store: deposited on the S3 server,
fetched by another store object (another machine's view), it is the committed block byte for
byte, and grafted it gives the logit bytes recorded for this CPU kind (test_portability.py)."""

import json

import pytest
import tensorstore as ts
from store_servers import s3_server, s3_spec, unique_path  # noqa: F401
from test_portability import (
  FIXTURES,
  RECORD,
  assert_matches_recording,
  no_recording_reason,
  recording_for,
)

from graftjax import blocks
from graftjax import determinism
from graftjax import store as store_lib
from graftjax.studies.store import portable_block


def _through_s3(server) -> store_lib.BlockStore:
  """A store on the S3 server holding the fixture block, opened afresh after the deposit."""
  path = unique_path()
  fixture = store_lib.BlockStore(FIXTURES / 'portable_store', read_only=True)
  depositor = store_lib.BlockStore(s3_spec(server.url, path))
  assert depositor.put(fixture.get(RECORD['key'])) == RECORD['key']
  return store_lib.BlockStore(s3_spec(server.url, path), read_only=True)


@pytest.mark.subprocess  # the S3 server
def test_a_block_fetched_from_s3_is_the_committed_block_byte_for_byte(request, tmp_path):
  fetched = _through_s3(request.getfixturevalue('s3_server'))
  key = RECORD['key']
  assert fetched.list() == [key]
  fetched.verify(key)
  committed = FIXTURES / 'portable_store' / key
  manifest = json.loads(fetched._kv.read(f'{key}/{store_lib.MANIFEST}').result().value)
  # On an object store the payload lies under its writer's prefix, which the manifest names
  # (format 5); the manifest is the committed one but for that.
  assert manifest.pop('format') == store_lib.PREFIXED_FORMAT
  remote = fetched._kv / f'{key}/{manifest.pop("data")}/'
  committed_manifest = json.loads((committed / store_lib.MANIFEST).read_text())
  assert committed_manifest.pop('format') == store_lib.FORMAT
  assert manifest == committed_manifest
  names = sorted(n.decode() for n in remote.list().result())
  assert names == sorted(
    str(p.relative_to(committed))
    for p in committed.rglob('*')
    if p.is_file() and p.name != store_lib.MANIFEST
  )
  for name in names:
    assert remote.read(name).result().value == (committed / name).read_bytes(), name
  local = store_lib.BlockStore(tmp_path / 'store')
  assert local.put(fetched.get(key)) == key
  assert store_lib.digest_tree(tmp_path / 'store' / key) == RECORD['block_tree_sha256']


@pytest.mark.subprocess  # the S3 server
def test_an_altered_object_in_s3_is_not_fetched(request):
  fetched = _through_s3(request.getfixturevalue('s3_server'))
  raw = ts.KvStore.open(fetched._kv.spec().to_json()).result()
  data = json.loads(raw.read(f'{RECORD["key"]}/{store_lib.MANIFEST}').result().value)['data']
  chunk = f'{RECORD["key"]}/{data}/k/c.0.0.0.0'
  data = bytearray(raw.read(chunk).result().value)
  data[0] ^= 1
  raw.write(chunk, bytes(data)).result()
  with pytest.raises(store_lib.CorruptBlockError, match='k/c.0.0.0.0'):
    fetched.get(RECORD['key'])


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.subprocess  # the S3 server
def test_a_block_fetched_from_s3_grafts_to_the_recorded_logit_bytes(request):
  recording = recording_for(determinism.record(), RECORD['logits_by_cpu_kind'])
  if recording is None:
    pytest.skip(no_recording_reason(determinism.record(), RECORD['logits_by_cpu_kind']))
  model = request.getfixturevalue('real_model')
  assert model.fingerprint == RECORD['model_fingerprint']
  fetched = _through_s3(request.getfixturevalue('s3_server'))
  cache = blocks.graft(
    model.init_cache(capacity=RECORD['capacity']),
    fetched.get(RECORD['key']),
    target=model.graft_target,
    # A block of layout 2 records no chunk size; the fixture's record names the one it had.
    chunk_size=RECORD['chunk_size'],
    allow_other_shape=True,
  )
  ids, prefix = RECORD['token_ids'], RECORD['prefix_tokens']
  logits, _ = model.prefill(
    ids[prefix:], cache=cache, chunk_size=RECORD['chunk_size'], start_position=prefix, logits='all'
  )
  assert_matches_recording(logits, recording)


def test_the_portable_block_experiment_deposits_and_grafts_on_cpu(tiny_model, tmp_path):
  """experiments/portable_block.py's two halves, on one machine: the moved block grafts to the
  fresh bytes, and a store.tar that is not the recorded one is refused."""
  settings = portable_block.Settings(prefix_tokens=24, continuation_tokens=8, chunk_size=8)
  deposited = portable_block.deposit(
    tiny_model, model_name='tiny', settings=settings, folder=tmp_path / 'moved'
  )
  assert deposited['summary'] == {'grafted_equals_fresh_here': True}
  grafted = portable_block.graft(tiny_model, model_name='tiny', folder=tmp_path / 'moved')
  assert all(grafted['summary'].values()), grafted['summary']
  assert 'ARE byte-equal' in portable_block.verdict(grafted)
  with open(tmp_path / 'moved' / portable_block.STORE_TAR, 'ab') as f:
    f.write(b'\0' * 512)
  with pytest.raises(ValueError, match='not the file its record'):
    portable_block.graft(tiny_model, model_name='tiny', folder=tmp_path / 'moved')
