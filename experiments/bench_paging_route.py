r"""Catalog lookup cost against the number of catalogued pages.

    python experiments/bench_paging_route.py --entries=10,100,1000,10000 \
        --out=experiments/results/paging/paging_route_cpu.json

Entries are real text: the Python standard library's .py files cut into
pieces of `--lines` lines, shuffled with a fixed seed, so each catalog size
holds the first N pieces (the sets are nested). For each size a sqlite
catalog (`graftjax.paging.catalog`) is filled, and each router answers
`--queries` queries drawn from the catalogued pieces: BM25 (`BM25Router`)
a single line of >= 40 characters of a piece, exact recurrence
(`ExactRouter`) the piece's whole text. A lookup is route (k=1) plus
fetching the entry from sqlite; each is timed alone and the median (and
90th percentile) reported, since the CPU is shared. The BM25 index is
built once per size (after the adds) and timed apart; top-1 accuracy (the
query's own piece first) is a sanity check, not a retrieval benchmark.
No model is run.
"""

from absl import app
from absl import flags
from graftjax.studies.paging import bench_paging_route
from graftjax.studies.common import cli
from graftjax.studies.common import results

_ENTRIES = flags.DEFINE_list('entries', ['10', '100', '1000', '10000'], 'Catalog sizes.')
_QUERIES = flags.DEFINE_integer('queries', 200, 'Queries per size and router.')
_LINES = flags.DEFINE_integer('lines', 25, 'Lines of source per catalogued piece.')
_SEED = flags.DEFINE_integer('seed', 0, 'Shuffle and query seed.')
_OUT = flags.DEFINE_string('out', 'experiments/results/paging/paging_route.json', 'Result JSON.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = bench_paging_route.experiment(
    sizes=[int(x) for x in _ENTRIES.value],
    queries=_QUERIES.value,
    lines=_LINES.value,
    seed=_SEED.value,
  )
  print(bench_paging_route.format_rows(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
