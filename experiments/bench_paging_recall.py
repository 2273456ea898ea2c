r"""Paged recall: overlapping pages against facts cut by a boundary; routing over mixed sizes.

    python experiments/bench_paging_recall.py \
        --out=experiments/results/paging/paging_recall_cpu.json

Overlap: standard-library text (after the routing store's pieces), cut into
pages of `--page_tokens` tokens of the tiny random model (one token per
byte), with a fact planted across each plain page boundary; for each of
`--overlaps`, the pages are prefilled, stored and catalogued (BM25), each
fact's question routed top-1 and the page read, verified and installed. It
reports the tokens and bytes stored per document token, how many boundary
facts lie whole in the routed page (Wilson 95%), and access time; and, from
its config, what each overlap costs gemma-3-270m in bfloat16.

Routing: `--facts` long pages (pieces of `--lines` lines of the standard
library, a fact of one of four templates planted in each) and
`--short_pages` short notes that repeat the templates' words; direct and
reworded questions routed by BM25 over whole pages, BM25 without length
normalisation, and BM25 over fixed-size routing units (`UnitRouter`);
top-1/top-4 with Wilson 95% and, on `--absent` questions whose fact is not
stored, the false-hit rate by score threshold and at a threshold fitted on half
the questions, reported on the other half. With `--router_model` (gemma3-270m
by default; '' for none), the hybrid arms too: BM25 units mixed with the
model's own embedding (the weight of `--weights` fitted on the calibration
half), and that mix with its top `--rerank` pages, and `--rerank_rare` more by
the question's rare words, reranked by the model (the query's log-likelihood gain
after each page's best unit, its tokens weighted by `--rerank_weighting`), over the
questions of `--rerank_wordings`. The real
model runs on CPU here: about half an hour on two shared cores, most of it the
rerank. And the first stage's recall: how often the fact's page is among
`UnitRouter`'s top c pages, for each c of `--recall_at` (what a rerank of c
candidates can reach at most), alone and with 4 candidates by the rare words.
`--needle_set=unseen` routes a second set of templates and notes, written apart from
the routers' development:

    python experiments/bench_paging_recall.py --needle_set=unseen --facts=80 \
        --short_pages=1517 --router_model= --overlaps=0,64 --boundary_facts=12 \
        --out=experiments/results/paging/paging_recall_unseen_cpu.json
"""

from absl import app
from absl import flags
from graftjax.studies.paging import bench_paging_recall
from graftjax.studies.paging import bench_paging_route
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import results

_PAGE_TOKENS = flags.DEFINE_integer('page_tokens', 256, 'Tokens per page (BOS included).')
_OVERLAPS = flags.DEFINE_list('overlaps', ['0', '32', '64', '128'], 'Overlaps in tokens.')
_BOUNDARY_FACTS = flags.DEFINE_integer('boundary_facts', 40, 'Facts placed across boundaries.')
_FACTS = flags.DEFINE_integer('facts', 120, 'Long pages, one fact each.')
_ABSENT = flags.DEFINE_integer('absent', 60, 'Questions whose fact is not stored.')
_SHORT_PAGES = flags.DEFINE_integer('short_pages', 600, 'Short pages.')
_LINES = flags.DEFINE_integer('lines', 25, 'Lines of source per long page.')
_THRESHOLDS = flags.DEFINE_list(
  'thresholds', ['0', '0.3', '0.5', '0.6', '0.7', '0.8', '0.9'], 'Score thresholds.'
)
_ROUTER_MODEL = model_flag.define(
  'gemma3-270m', help_text='Model of the hybrid arms.', name='router_model', optional=True
)
_WEIGHTS = flags.DEFINE_list(
  'weights', ['1.0', '0.95', '0.9', '0.8', '0.5'], 'BM25 weights of the mix to fit.'
)
_RERANK = flags.DEFINE_integer('rerank', 4, 'Pages reranked by the model.')
_RERANK_RARE = flags.DEFINE_integer(
  'rerank_rare', 0, "More pages reranked, by the question's rare words (its names)."
)
_RERANK_WORDINGS = flags.DEFINE_list(
  'rerank_wordings', ['direct', 'reworded'], 'Questions the rerank arm routes (both: calibrated).'
)
_RERANK_WEIGHTING = flags.DEFINE_enum(
  'rerank_weighting',
  'idf',
  ['idf', 'mean'],
  "The rerank's mean over query tokens: weighted by each token's IDF over the units, or plain.",
)
_RECALL_AT = flags.DEFINE_list(
  'recall_at', ['1', '4', '16', '64'], "Candidate counts of the first stage's recall."
)
_NEEDLE_SET = flags.DEFINE_enum(
  'needle_set',
  'four',
  list(bench_paging_recall.NEEDLE_SETS),
  "The routing store's templates and short notes.",
)
_SEED = flags.DEFINE_integer('seed', 0, 'Names, numbers and places.')
_OUT = flags.DEFINE_string('out', 'experiments/results/paging/paging_recall.json', 'Result JSON.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  boundary_text = 4 * (_BOUNDARY_FACTS.value + 2)  # pieces of ~1 kB each cover the document
  filler = [
    text
    for _, text in bench_paging_route.pieces(
      _FACTS.value + boundary_text, _LINES.value, _SEED.value
    )
  ]
  settings = bench_paging_recall.Settings(
    model_name='tiny',
    page_tokens=_PAGE_TOKENS.value,
    overlaps=[int(x) for x in _OVERLAPS.value],
    boundary_facts=_BOUNDARY_FACTS.value,
    facts=_FACTS.value,
    absent=_ABSENT.value,
    short_pages=_SHORT_PAGES.value,
    thresholds=[float(x) for x in _THRESHOLDS.value],
    chunk_size=64,
    seed=_SEED.value,
    filler=filler,
    router_model=_ROUTER_MODEL.value or None,
    weights=[float(x) for x in _WEIGHTS.value],
    rerank=_RERANK.value,
    rerank_rare=_RERANK_RARE.value,
    rerank_wordings=_RERANK_WORDINGS.value,
    rerank_weighting=_RERANK_WEIGHTING.value,
    recall_at=[int(x) for x in _RECALL_AT.value],
    needle_set=_NEEDLE_SET.value,
  )
  try:
    bench_paging_recall.check(settings)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  result = bench_paging_recall.experiment(settings)
  print(bench_paging_recall.format_rows(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
