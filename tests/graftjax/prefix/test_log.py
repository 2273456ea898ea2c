"""The span log: appends by several writers at once are all kept, numbered without gaps, and a
reader learns of new entries by reading only those after the last it saw."""

import concurrent.futures
import json

import tensorstore as ts

from graftjax import store as store_lib
from graftjax.prefix import log as log_lib
from graftjax.prefix import spans


def _kv(tmp_path):
  return spans.log_kvstore(store_lib.BlockStore(tmp_path / 'store'))


def test_concurrent_appends_keep_every_record_without_gaps(tmp_path):
  kv = _kv(tmp_path)
  writers = [log_lib.SpanLog(kv) for _ in range(4)]

  def append(w):
    return [writers[w].append({'writer': w, 'i': i})[0] for i in range(10)]

  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    numbers = [n for ns in pool.map(append, range(4)) for n in ns]
  assert sorted(numbers) == list(range(40))
  records = log_lib.SpanLog(kv).read_new()
  assert sorted((r['writer'], r['i']) for r in records) == [
    (w, i) for w in range(4) for i in range(10)
  ]


def test_a_reader_reads_only_the_new_entries(tmp_path):
  kv = _kv(tmp_path)
  writer, reader = log_lib.SpanLog(kv), log_lib.SpanLog(kv)
  for i in range(5):
    writer.append({'i': i})
  assert [r['i'] for r in reader.read_new()] == list(range(5))
  reads = reader.reads
  writer.append({'i': 5})
  assert [r['i'] for r in reader.read_new()] == [5]
  assert reader.reads - reads == 2  # the new entry, then the first absent one


def test_an_entry_is_never_overwritten(tmp_path):
  kv = _kv(tmp_path)
  a, b = log_lib.SpanLog(kv), log_lib.SpanLog(kv)
  assert a.append({'from': 'a'})[0] == 0
  seq, others = b.append({'from': 'b'})  # b had read nothing: it finds entry 0 taken
  assert seq == 1 and others == [{'from': 'a'}]
  assert json.loads(kv.read(log_lib.entry_name(0)).result().value) == {'from': 'a'}


def test_the_log_works_on_a_memory_kvstore():
  store = store_lib.BlockStore(ts.KvStore.open('memory://').result())
  log = log_lib.SpanLog(spans.log_kvstore(store))
  assert [log.append({'i': i})[0] for i in range(3)] == [0, 1, 2]
  assert store.list() == []  # the log is no block
