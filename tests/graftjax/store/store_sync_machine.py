"""One of two machines sharing a library through an object store (test_store_sync_processes.py).

    python tests/graftjax/store/store_sync_machine.py deposit <spec.json> <cache_dir> <out.json>
    python tests/graftjax/store/store_sync_machine.py answer <spec.json> <cache_dir> <out.json>

`spec.json` holds the tensorstore spec of the shared prefix (credentials from the
environment); the library lives under it and the pages under `pages/`. Each machine keeps
its catalogs in its own `cache_dir`. `deposit` (machine A) deposits verified solutions and
pages, answers QUESTION with its own deposit and writes the answer's logits digest; `answer`
(machine B, an empty cache) synchronises both catalogs, routes QUESTION and PAGE_QUERY, and
answers with the routed block.
"""

import json
import pathlib
import sys

from graftjax import determinism

determinism.pin()

import numpy as np

from graftjax import blocks
from graftjax import ledger
from graftjax import store as store_lib
from graftjax.flywheel import answer as answer_lib
from graftjax.flywheel import library as library_lib
from graftjax.flywheel import tasks
from graftjax.flywheel import verifiers
from graftjax.models.gemma import model as gemma_model
from graftjax.paging import catalog as catalog_lib
from graftjax.paging import pages as pages_lib
from graftjax.routing import route as route_lib

SHAPE = library_lib.Shape(capacity=256, chunk_size=16)
ITEMS = {
  'q1': ('What is the capital of Norway?', 'Oslo'),
  'q2': ('Which metal melts at the lowest temperature?', 'mercury'),
  'q3': ('How many legs has a spider?', 'eight'),
}
QUESTION = ITEMS['q2'][0]
PAGES = (
  'the tar archive reader walks member headers one by one',
  'a heap queue keeps the smallest item first and pops it',
)
PAGE_QUERY = 'how does the heap queue keep its smallest item'


def last_word(text, gold):
  words = text.replace('.', ' ').split()
  return verifiers.Verdict(
    bool(words) and words[-1] in gold, words[-1] if words else None, tuple(gold), 'last_word', 1
  )


def model():
  return gemma_model.tiny()


def describe_page(tokenizer):
  """A page's row from its own tokens: all another machine knows of it."""
  return lambda key, meta: (tokenizer.decode(meta.token_ids), 'shared')


def deposit(spec, cache: pathlib.Path) -> dict:
  m = model()
  library = library_lib.Library(spec, shape=SHAPE, index=cache / 'library.db')
  for item_id, (question, answer) in ITEMS.items():
    item = tasks.Item(
      task='toy', id=item_id, question=question, answer=answer, source='test', split='test'
    )
    library.deposit(
      m, item=item, verifier=last_word, solution=answer, source='reference', tokens_spent=0
    )
  pages = store_lib.BlockStore({**spec, 'path': spec['path'] + 'pages/'})
  page_keys = []
  with catalog_lib.Catalog(cache / 'pages.sqlite', store=pages) as catalog:
    for text in PAGES:
      ids = m.tokenizer.encode(text)
      fresh = m.init_cache(capacity=SHAPE.capacity)
      _, cache_ = m.prefill(ids, cache=fresh, chunk_size=SHAPE.chunk_size, logits='none')
      block = blocks.capture(
        cache_,
        blocks.Span(0, len(ids)),
        token_ids=ids,
        target=m.graft_target,
        chunk_size=SHAPE.chunk_size,
      )
      page = pages_lib.to_page(block, m.config)
      key = pages_lib.put(pages, page)
      catalog.add(
        key,
        m.tokenizer.decode(ids),
        source='a',
        n_tokens=len(ids),
        model_fingerprint=block.meta.model_fingerprint,
        dtype=block.meta.dtype,
        page_layout=page.layout,
      )
      page_keys.append(key)
  entry = library.find('toy', 'q2')
  said = answer_lib.answer(m, library, entry, QUESTION, mode='recall', max_new_tokens=4)
  return {
    'key': entry.key,
    'page_key': page_keys[1],
    'logits_sha256': ledger.sha256_array(said.first_logits),
    'token_ids': list(said.token_ids),
  }


def answer(spec, cache: pathlib.Path) -> dict:
  m = model()
  library = library_lib.Library(spec, shape=SHAPE, index=cache / 'library.db')
  empty = len(library.entries())
  synced = library.sync()
  router = route_lib.BM25Router(threshold=0.0)
  router.add_many(library_lib.route_pairs(library.entries()))
  (hit,) = router.route(QUESTION)
  entry = next(e for e in library.entries() if e.key == hit.key)
  said = answer_lib.answer(m, library, entry, QUESTION, mode='recall', max_new_tokens=4)
  pages = store_lib.BlockStore({**spec, 'path': spec['path'] + 'pages/'})
  with catalog_lib.Catalog(cache / 'pages.sqlite', store=pages) as catalog:
    pages_synced = catalog.sync(describe_page(m.tokenizer))
    (page_entry, _), *_ = catalog.route(PAGE_QUERY)
    page = pages_lib.get(pages, page_entry.key)  # every byte verified
  return {
    'rows_before_sync': empty,
    'synced': {'listed': synced.listed, 'records': synced.records, 'read': synced.read},
    'pages_synced': {'listed': pages_synced.listed, 'read': pages_synced.read},
    'key': entry.key,
    'page_key': page_entry.key,
    'page_layout': None if page.layout is None else [list(p) for p in page.layout],
    'logits_sha256': ledger.sha256_array(np.asarray(said.first_logits)),
    'token_ids': list(said.token_ids),
  }


if __name__ == '__main__':
  role, spec_path, cache_dir, out = sys.argv[1:]
  spec = json.loads(pathlib.Path(spec_path).read_text())
  cache_dir = pathlib.Path(cache_dir)
  cache_dir.mkdir(parents=True, exist_ok=True)
  result = {'deposit': deposit, 'answer': answer}[role](spec, cache_dir)
  pathlib.Path(out).write_text(json.dumps(result, indent=1))
