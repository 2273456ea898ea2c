r"""Page-in against re-prefill for blocks of 32 to 8k tokens.

    python experiments/bench_paging_pagein.py \
        --tokens=32,64,128,256,512,1024,2048,4096,8192 \
        --out=experiments/results/paging/paging_pagein_cpu.json

For each block size n (real text: standard-library sources, concatenated):
the block is prefilled in chunks of `--chunk_size` into a cache of capacity
C (n + 1 rounded up to a chunk, plus a chunk), captured, cut to a page
(`graftjax.paging.pages.to_page`: global layers whole, local layers' last
W - 1 rows) and stored in a file BlockStore; then, timed,
  page_in    read + verify the page into reused host staging
             (`graftjax.restore.Staging`), make a new cache, install it,
             forward the next token (1-token query at position n);
  recompute  make a new cache, prefill the n tokens in the same chunks,
             forward the same query.
Both paths' query logits are asserted byte-equal (SHA-256 of their bytes)
to each other and to the query run on the cache the block came from. The
costs give `graftjax.paging.policy.Policy` and its crossover. Bytes per
token are measured on disk (chunk files of the stored page and of the
plain block) and computed from the config, against llama.cpp's state file
(`--llamacpp_result`, the committed bench_graft_cpu.json). Timings are
medians of `--repeats` runs after a warm-up (recompute: no warm-up, the
capture compiled its prefill; `--recompute_repeats` runs at n >= 2048) on a
CPU shared with other work.
"""

from graftjax import determinism

determinism.pin()

from absl import app
from absl import flags
from graftjax.studies.paging import bench_paging_pagein
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import results

_MODEL = model_flag.define('gemma3-270m', ['gemma3-270m', 'tiny'], 'Model.')
_TOKENS = flags.DEFINE_list(
  'tokens', ['32', '64', '128', '256', '512', '1024', '2048', '4096', '8192'], 'Block sizes.'
)
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 512, 'Prefill chunk (both paths).')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repeats (median reported).')
_RECOMPUTE_REPEATS = flags.DEFINE_integer(
  'recompute_repeats', 1, 'Timed recompute repeats at n >= 2048 (slow on CPU).'
)
_LLAMACPP_RESULT = flags.DEFINE_string(
  'llamacpp_result',
  'experiments/results/graft_speed/bench_graft_cpu.json',
  "bench_graft result holding llama.cpp's state file sizes.",
)
_OUT = flags.DEFINE_string('out', 'experiments/results/paging/paging_pagein.json', 'Result JSON.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = bench_paging_pagein.experiment(
    model_name=_MODEL.value,
    dtype=_DTYPE.value,
    sizes=[int(x) for x in _TOKENS.value],
    chunk_size=_CHUNK_SIZE.value,
    repeats=_REPEATS.value,
    recompute_repeats=_RECOMPUTE_REPEATS.value,
    llamacpp_result=_LLAMACPP_RESULT.value,
  )
  print(bench_paging_pagein.format_rows(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
