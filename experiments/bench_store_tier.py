r"""Restore from a local S3 server against `file` and against the server's raw GET floor.

    python experiments/bench_store_tier.py --tokens=1024,4096,16384,32768 \
        --out=experiments/results/store_tier/store_tier_cpu.json

Blocks of random values shaped like `--model`'s cache (`--dtype`), each size put on a moto
S3 server started here on loopback and in a `file` store, then restored (read + every digest
checked) from both, and the same objects fetched by raw concurrent GETs (the floor), side by
side in one run; and `--pages` blocks of `--page_tokens` tokens read one after the other
against one concurrent fetch of all their objects. The server shares this CPU with the
client: times are CPU-local-server times. Best and median of `--repeats` runs after a warm-up
(`--page_repeats` for the pages). `--sweep` measures the largest size again at each of those
request concurrencies.
"""

from absl import app
from absl import flags
from graftjax.studies.store import bench_store_tier
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import results

_DEFAULTS = bench_store_tier.Settings()
_MODEL = model_flag.define_config(_DEFAULTS.config, 'Config whose cache shape blocks take.')
_DTYPE = flags.DEFINE_enum('dtype', _DEFAULTS.dtype, ['bfloat16', 'float32'], 'k, v dtype.')
_TOKENS = flags.DEFINE_list('tokens', [str(n) for n in _DEFAULTS.tokens], 'Block sizes.')
_PAGES = flags.DEFINE_integer('pages', _DEFAULTS.pages, 'Small pages (0: none).')
_PAGE_TOKENS = flags.DEFINE_integer('page_tokens', _DEFAULTS.page_tokens, 'Tokens per page.')
_CONCURRENCY = flags.DEFINE_integer(
  'concurrency', _DEFAULTS.concurrency, 'Requests in flight at once (restore and floor).'
)
_REPEATS = flags.DEFINE_integer('repeats', _DEFAULTS.repeats, 'Timed runs after a warm-up.')
_PAGE_REPEATS = flags.DEFINE_integer(
  'page_repeats', _DEFAULTS.page_repeats, 'Timed runs of the pages after a warm-up.'
)
_SWEEP = flags.DEFINE_list(
  'sweep', [], 'Request concurrencies at which the largest size is measured again.'
)
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/store_tier/store_tier_cpu.json', 'Result JSON.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  settings = bench_store_tier.Settings(
    config=_MODEL.value,
    dtype=_DTYPE.value,
    tokens=tuple(int(n) for n in _TOKENS.value),
    pages=_PAGES.value,
    page_tokens=_PAGE_TOKENS.value,
    concurrency=_CONCURRENCY.value,
    repeats=_REPEATS.value,
    page_repeats=_PAGE_REPEATS.value,
    sweep=tuple(int(c) for c in _SWEEP.value),
  )
  results.write(_OUT.value, bench_store_tier.experiment(settings))


if __name__ == '__main__':
  cli.run(main)
