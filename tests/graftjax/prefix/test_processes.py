"""Two processes deposit and reuse spans on one `file` store at once: every prefill is
byte-equal to a cold one, the span log keeps every record, and every span it names verifies."""

import json
import pathlib
import sys

import prefix_cases as cases

from graftjax import store as store_lib
from graftjax.prefix import log as log_lib
from graftjax.prefix import spans

WORKER = pathlib.Path(__file__).with_name('prefix_worker.py')


def test_two_processes_share_one_store_exactly(tmp_path, run_together):
  root = str(tmp_path / 'store')
  store_lib.BlockStore(root)
  orders = ('20,13,9,17', '9,17,20,13')
  procs = run_together(*[[sys.executable, str(WORKER), root, order] for order in orders])
  for proc in procs:
    assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(line) for proc in procs for line in proc.stdout.splitlines()]
  assert len(rows) == 8 and all(row['equal'] for row in rows), rows
  store = store_lib.BlockStore(root)
  records = log_lib.SpanLog(spans.log_kvstore(store)).read_new()
  held = spans.SpanStore(store)
  for record in records:
    held.get(record['key'], record['block'])  # every byte checked
  # Each process's later prompts reuse what either deposited; a third sees it all.
  assert sum(row['hit'] for row in rows) > 0
  engine = cases.engine(cases.model('tiny'), store)
  out = engine.prefill(cases.IDS, deposit=False)
  assert out.hit == cases.N - 1
  assert out.logits.tobytes() == cases.cold(cases.model('tiny')).tobytes()
