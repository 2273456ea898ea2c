"""The span log and the engine on S3 (moto's server on loopback): conditional appends by
several writers keep every record, and spans deposited there are reused exactly."""

import concurrent.futures
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / 'store'))

import prefix_cases as cases
from store_servers import s3_server, s3_spec, unique_path  # noqa: F401

from graftjax import store as store_lib
from graftjax.prefix import log as log_lib
from graftjax.prefix import spans


def test_concurrent_appends_on_s3_keep_every_record_without_gaps(s3_server):  # noqa: F811
  store = store_lib.BlockStore(s3_spec(s3_server.url, unique_path()))
  kv = spans.log_kvstore(store)
  writers = [log_lib.SpanLog(kv) for _ in range(3)]

  def append(w):
    return [writers[w].append({'writer': w, 'i': i})[0] for i in range(5)]

  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    numbers = [n for ns in pool.map(append, range(3)) for n in ns]
  assert sorted(numbers) == list(range(15))
  assert len(log_lib.SpanLog(kv).read_new()) == 15


def test_spans_deposited_on_s3_are_reused_exactly(s3_server):  # noqa: F811
  m = cases.model('tiny', 'xla')
  spec = s3_spec(s3_server.url, unique_path())
  cases.engine(m, store_lib.BlockStore(spec)).prefill(cases.diverging(cases.IDS, 13))
  out = cases.engine(m, store_lib.BlockStore(spec)).prefill(cases.IDS, deposit=False)
  assert out.hit == 12  # 13 rounded down to the chunk grid of 4
  assert out.logits.tobytes() == cases.cold(m, chunk_size=cases.CHUNK).tobytes()
