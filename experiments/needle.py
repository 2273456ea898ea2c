r"""Needles in a paged store: routed page-in against the base model over a window.

    python experiments/needle.py --model=gemma3-270m --needles=50 --page_tokens=512 \
        --pages_per_window=4 --out=experiments/results/paging/paging_needle_cpu.json

Distinct facts ("The access code of <name> is <number>.") are planted, one
per page, in pages of `--page_tokens` tokens of standard-library source;
`--pages_per_window` consecutive pages make a window. Each question names its
fact and is answered twice by greedy completion of `--answer_tokens` tokens:
paged (BM25 over a sqlite catalog of the stored pages, the top page read,
verified and installed into an empty window, the question after it) and
base (the model prefills the whole window holding the fact, its other
facts included, and the question follows). Accuracy of both with Wilson 95%
intervals, routing top-1, page access latency (route + read + verify +
install) of this real-model store. On CPU the window is short (4 x 511 + 1
tokens); the 32k window is for a GPU (`--pages_per_window=64`).

A needle set of your own: `--templates=facts.json` (a list of {"fact": "The
locker of {name} is {number}.", "question": "...{name}...?", "answer": "The
locker of {name} is"}; fact i takes template i mod their count),
`--haystack=a.txt,b.txt` (text files, read in order), `--placement=inside`
(a line break inside a page), `boundary` (across a page boundary) or `mixed`,
`--overlap` (tokens shared by consecutive pages) and `--router=units` (BM25 over
fixed-size routing units, for stores of mixed page sizes). The result splits the
base arm by whether the window holds another fact of the same template, both
arms by facts at a boundary, and counts answers that give another fact's number.

    python experiments/needle.py --model=tiny --needles=8 --page_tokens=256 \
        --templates=facts.json --haystack=notes.txt --placement=mixed --overlap=64 \
        --out=/tmp/needle.json

`--top_k=4` adds a third arm: each question after its 4 best routed pages composed side by
side (`PagedContext`, each page in its own attention segment, the best next to the question).
It needs `--position_scheme=rope_relative` and split-invariant attention: `--impl=pallas`, or on
CPU `--impl=xla_split` (XLA, attention summed by absolute splits; docs/composition.md).
`--topk_threshold` composes only the pages scoring at least it (the best page always); the
result counts answers that give the number of a fact composed beside the right one:

    python experiments/needle.py --model=gemma3-270m --needles=24 --page_tokens=512 \
        --pages_per_window=4 --impl=xla_split --position_scheme=rope_relative --top_k=4 \
        --out=experiments/results/paging/paging_needle_topk4_cpu.json
"""

from graftjax import determinism

determinism.pin()

from absl import app
from absl import flags
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.paging import needle
from graftjax.studies.paging import paging_scale
from graftjax.studies.common import results

_MODEL = model_flag.define('gemma3-270m', paging_scale.MODELS, 'Model.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_IMPL = flags.DEFINE_enum(
  'impl', 'xla', ['xla', 'pallas', 'xla_split'], 'Kernels (xla_split: XLA, split attention).'
)
_SCHEME = flags.DEFINE_enum(
  'position_scheme', 'rope', ['rope', 'rope_relative'], 'Position scheme (top-k: rope_relative).'
)
_TOP_K = flags.DEFINE_integer('top_k', 0, 'Also answer from the top-k pages composed (0: not).')
_TOPK_THRESHOLD = flags.DEFINE_float(
  'topk_threshold', None, 'Compose only top-k pages scoring at least this (the best always).'
)
_STORE = flags.DEFINE_string(
  'store', None, 'A store grown by paging_scale.py to route over (default: the needle pages only).'
)
_NEEDLES = flags.DEFINE_integer('needles', 50, 'Facts planted (one per page).')
_PAGE_TOKENS = flags.DEFINE_integer('page_tokens', 512, 'Tokens per page (BOS included).')
_PAGES_PER_WINDOW = flags.DEFINE_integer('pages_per_window', 4, "Pages in the base model's window.")
_ANSWER_TOKENS = flags.DEFINE_integer('answer_tokens', 6, 'Greedy answer tokens.')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 512, 'Prefill chunk of pages and windows.')
_QUESTION_CHUNK = flags.DEFINE_integer('question_chunk', 8, 'Prefill chunk of the question.')
_SEED = flags.DEFINE_integer('seed', 0, 'Names, numbers and places.')
_TEMPLATES = flags.DEFINE_string(
  'templates', 'access_code', 'A JSON file of fact templates, or a named set: access_code, four.'
)
_HAYSTACK = flags.DEFINE_list(
  'haystack', None, 'Text files to plant the facts in (default: the standard library).'
)
_PLACEMENT = flags.DEFINE_enum('placement', 'inside', needle.PLACEMENTS, 'Where facts go.')
_OVERLAP = flags.DEFINE_integer('overlap', 0, 'Tokens shared by consecutive pages.')
_ROUTER = flags.DEFINE_enum(
  'router', 'bm25', list(needle.ROUTERS), 'BM25 over whole pages, or over fixed-size units.'
)
_MARGIN = flags.DEFINE_integer('margin', 32, 'Tokens kept clear of a page edge by inside facts.')
_OUT = flags.DEFINE_string('out', 'experiments/results/paging/paging_needle.json', 'Result JSON.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = needle.experiment(
    needle.Settings(
      model_name=_MODEL.value,
      dtype=_DTYPE.value,
      impl=_IMPL.value,
      store_dir=_STORE.value,
      needles=_NEEDLES.value,
      page_tokens=_PAGE_TOKENS.value,
      pages_per_window=_PAGES_PER_WINDOW.value,
      answer_tokens=_ANSWER_TOKENS.value,
      chunk_size=_CHUNK_SIZE.value,
      question_chunk=_QUESTION_CHUNK.value,
      seed=_SEED.value,
      templates=needle.load_templates(_TEMPLATES.value),
      placement=_PLACEMENT.value,
      overlap=_OVERLAP.value,
      haystack=_HAYSTACK.value,
      margin=_MARGIN.value,
      router=_ROUTER.value,
      top_k=_TOP_K.value,
      topk_threshold=_TOPK_THRESHOLD.value,
      position_scheme=_SCHEME.value,
    )
  )
  print(needle.format_summary(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
