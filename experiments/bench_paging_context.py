r"""Paged attention context: host-tier hit/miss and open latency.

    python experiments/bench_paging_context.py --model=tiny --pages=32 --page_tokens=200 \
        --k=3 --capacity=1024 --out=experiments/results/paging/paging_context_cpu.json

Standard-library source cut into pages, each prefilled alone (rope_relative, Pallas kernels),
stored window-trimmed and catalogued; then, per page, a store read, a host-tier miss and a
host-tier hit (verified and not), and per query a routed `PagedContext.open` (route + read +
verify + install of the top-k pages) with the tier cold and warm. The first query's logits are
checked byte-equal to a fresh block-attention prefill of the same pages. Medians (the CPU is
shared); see graftjax/studies/paging/bench_paging_context.py.
"""

from graftjax import determinism

determinism.pin()

from absl import app
from absl import flags
from graftjax.studies.paging import bench_paging_context
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import results

_MODEL = model_flag.define('tiny', ['gemma3-270m', 'tiny'], 'Model.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_PAGES = flags.DEFINE_integer('pages', 32, 'Pages stored.')
_PAGE_TOKENS = flags.DEFINE_integer('page_tokens', 200, 'Tokens per page (BOS included).')
_K = flags.DEFINE_integer('k', 3, 'Pages routed per query.')
_CAPACITY = flags.DEFINE_integer('capacity', 1024, 'Slots of the context (32768: the real one).')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 8, 'Prefill chunk (deposits and the query).')
_QUERIES = flags.DEFINE_integer('queries', 16, 'Queries timed (cold and warm).')
_TIER_PAGES = flags.DEFINE_integer('tier_pages', 64, 'Pages the host tier has room for.')
_OUT = flags.DEFINE_string('out', 'experiments/results/paging/paging_context.json', 'Result JSON.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = bench_paging_context.experiment(
    model_name=_MODEL.value,
    dtype=_DTYPE.value,
    n_pages=_PAGES.value,
    page_tokens=_PAGE_TOKENS.value,
    k=_K.value,
    capacity=_CAPACITY.value,
    chunk_size=_CHUNK_SIZE.value,
    queries=_QUERIES.value,
    tier_pages=_TIER_PAGES.value,
  )
  print(bench_paging_context.format_summary(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
