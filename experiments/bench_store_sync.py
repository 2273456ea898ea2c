r"""What a catalog's sync costs at 10,000 stored blocks: from empty, incremental, no-op.

    python experiments/bench_store_sync.py --backend=s3 --blocks=10000 --new=100 \
        --out=experiments/results/store_sync/store_sync_s3_cpu.json

Fills a store (`--backend=s3`: a moto S3 server started on loopback for the run; `file`: a
temporary directory) with small synthetic blocks (one layer, two tokens: every file of the
format, the least payload), then syncs a sqlite catalog (`graftjax.paging.catalog`) from
empty, after `--new` more blocks, and with nothing new; records each sync's wall time, its
listing's, and the manifests it read. The listing is also timed alone: on an object store it
lists every object of every block, the floor of any sync. No model is run.
"""

import pathlib
import tempfile
import uuid

from absl import app
from absl import flags
from graftjax.studies.store import bench_store_sync
from graftjax.studies.store import local_s3
from graftjax.studies.common import cli
from graftjax.studies.common import results

_BACKEND = flags.DEFINE_enum('backend', 's3', ['s3', 'file'], 'Where the store lives.')
_BLOCKS = flags.DEFINE_integer('blocks', 10_000, 'Blocks stored before the first sync.')
_NEW = flags.DEFINE_integer('new', 100, 'Blocks stored before the incremental sync.')
_TIMEOUT = flags.DEFINE_float(
  'request_timeout', None, "Seconds a store request may take (default the store's 120)."
)
_OUT = flags.DEFINE_string('out', 'experiments/results/store_sync/store_sync.json', 'Result JSON.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  with tempfile.TemporaryDirectory() as scratch:
    folder = pathlib.Path(scratch)
    run = {'blocks_count': _BLOCKS.value, 'new': _NEW.value, 'folder': folder}
    run['timeout'] = _TIMEOUT.value
    if _BACKEND.value == 'file':
      result = bench_store_sync.experiment(spec=str(folder / 'store'), backend='file', **run)
    else:
      with local_s3.MotoServer() as server:
        spec = server.spec(f'sync/{uuid.uuid4().hex}/')
        result = bench_store_sync.experiment(spec=spec, backend='s3 (moto, loopback)', **run)
  print(bench_store_sync.format_rows(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
