r"""A page store grown from real text: access latency and device memory by size.

    python experiments/paging_scale.py --model=tiny-270m-layout --dtype=bfloat16 \
        --page_tokens=128 --local_rows=0 --window_slots=4096 --sizes=10,100,1000,10000 \
        --out=experiments/results/paging/paging_scale_cpu.json

    # GPU (experiments/device/paging.sh scale): the real model, resumable
    python experiments/paging_scale.py --model=gemma3-270m --dtype=bfloat16 --impl=pallas \
        --page_tokens=512 --local_rows=0 --window_slots=32768 --sizes=10,100,1000,10000 \
        --store=STORE --deadline_s=480 --out=experiments/results/paging/paging_scale_h200.json

Python sources are cut into pages of `--page_tokens` tokens, each prefilled
alone at slot 0, cut to a page (`--local_rows` of the local layers; -1: W - 1,
every row a later query can see; 0: the global layers only, exact for
queries W - 1 positions after the page), stored in a BlockStore at `--store`
and catalogued (sqlite + BM25). One store grows to each of `--sizes` pages;
at each, `--queries` queries (a line of a stored page) are answered by route +
read + verify + install into one window of `--window_slots` slots (access
latency, medians) and a one-token query; the device's memory
(`memory_stats()`, None on CPU; and the bytes of live jax arrays) and the
store's bytes on disk are recorded. A run stopped by `--deadline_s` (or
killed) resumes when run again with the same flags: catalogued pages are
skipped and measured sizes kept. `--plot` draws latency and memory against
pages stored next to the result. Models: gemma3-270m, tiny, and
tiny-270m-layout (tiny random weights, byte tokens, in the real model's
18-layer 5:1 layout with window 512), the CPU run's model.
"""

from graftjax import determinism

determinism.pin()

from absl import app
from absl import flags
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.paging import figures
from graftjax.studies.paging import paging_scale
from graftjax.studies.common import results

_MODEL = model_flag.define(paging_scale.TINY_270M_LAYOUT, paging_scale.MODELS, 'Model.')
_DTYPE = flags.DEFINE_enum('dtype', 'bfloat16', ['float32', 'bfloat16'], 'Compute dtype.')
_IMPL = flags.DEFINE_enum('impl', 'xla', ['xla', 'pallas'], 'Kernels of every op.')
_STORE = flags.DEFINE_string(
  'store', '/tmp/graftjax_paging_scale', 'Store folder (kept: a second run resumes it).'
)
_PAGE_TOKENS = flags.DEFINE_integer('page_tokens', 128, 'Tokens per page (BOS included).')
_LOCAL_ROWS = flags.DEFINE_integer('local_rows', 0, 'Local-layer rows kept (-1: W - 1).')
_WINDOW_SLOTS = flags.DEFINE_integer('window_slots', 4096, 'Slots of the window on the device.')
_SIZES = flags.DEFINE_list('sizes', ['10', '100', '1000', '10000'], 'Pages stored at each step.')
_QUERIES = flags.DEFINE_integer('queries', 100, 'Queries per size.')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 512, 'Prefill chunk of a page.')
_BATCH = flags.DEFINE_integer('batch', 1, 'Pages prefilled side by side.')
_THREADS = flags.DEFINE_integer('threads', 8, 'Concurrent store writes.')
_SEED = flags.DEFINE_integer('seed', 0, 'Page order and query seed.')
_DEADLINE_S = flags.DEFINE_float('deadline_s', None, 'Stop growing after this many seconds.')
_PLAN_ONLY = flags.DEFINE_bool(
  'plan_only', False, 'Only tokenize the corpus into the plan in --store (to carry it elsewhere).'
)
_PLOT = flags.DEFINE_bool('plot', True, 'Write the figure next to --out (PNG).')
_OUT = flags.DEFINE_string('out', 'experiments/results/paging/paging_scale.json', 'Result JSON.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if _PLAN_ONLY.value:
    plan = paging_scale.plan_only(
      model_name=_MODEL.value,
      dtype=_DTYPE.value,
      impl=_IMPL.value,
      store_dir=_STORE.value,
      page_tokens=_PAGE_TOKENS.value,
      num_pages=max(int(x) for x in _SIZES.value),
      seed=_SEED.value,
    )
    print(f'plan of {len(plan)} pages ({plan.made_with}) in {_STORE.value}: {plan.digest()}')
    return
  result = paging_scale.experiment(
    paging_scale.Settings(
      model_name=_MODEL.value,
      dtype=_DTYPE.value,
      impl=_IMPL.value,
      store_dir=_STORE.value,
      page_tokens=_PAGE_TOKENS.value,
      local_rows=None if _LOCAL_ROWS.value < 0 else _LOCAL_ROWS.value,
      window_slots=_WINDOW_SLOTS.value,
      sizes=[int(x) for x in _SIZES.value],
      queries=_QUERIES.value,
      chunk_size=_CHUNK_SIZE.value,
      seed=_SEED.value,
      batch=_BATCH.value,
      threads=_THREADS.value,
      deadline_s=_DEADLINE_S.value,
    )
  )
  print(paging_scale.format_rows(result))
  pngs = figures.write_figure(result, _OUT.value) if _PLOT.value else []
  results.write(_OUT.value, result, outputs=pngs)


if __name__ == '__main__':
  cli.run(main)
