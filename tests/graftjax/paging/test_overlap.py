"""Overlapping pages: no short fact is cut by a boundary, and each page installs exactly."""

import hashlib

import jax
import numpy as np
import pytest

from graftjax.paging import pages
from graftjax.routing import route as route_lib
from graftjax.studies.common import corpus
from graftjax.studies.paging import paging_scale

CAPACITY = 128
CHUNK = 16


def _sha(array) -> str:
  return hashlib.sha256(np.asarray(array).tobytes()).hexdigest()


@pytest.mark.parametrize('n,body,overlap', [(100, 20, 0), (100, 20, 7), (101, 31, 30), (20, 20, 5)])
def test_every_run_of_overlap_plus_one_tokens_lies_in_one_page(n, body, overlap):
  cuts = pages.spans(n, body, overlap)
  assert cuts[0][0] == 0 and cuts[-1][1] == n
  assert all(end - begin == min(body, n) for begin, end in cuts)
  for a in range(n - overlap):
    assert any(begin <= a and a + overlap + 1 <= end for begin, end in cuts), a


def test_without_overlap_a_fact_across_a_boundary_is_in_no_page():
  cuts = pages.spans(100, 20, 0)
  assert not any(begin <= 15 and 25 <= end for begin, end in cuts)
  assert any(begin <= 15 and 25 <= end for begin, end in pages.spans(100, 20, 10))


def test_bad_overlap_is_refused():
  with pytest.raises(ValueError, match='overlap'):
    pages.spans(100, 20, 20)
  with pytest.raises(ValueError, match='fill one page'):
    pages.cut([5] * 10, 32, overlap=4, bos=2)


def _document(tokenizer, fact: str, at: int) -> list[int]:
  rng = np.random.default_rng(3)
  words = ['lorem', 'ipsum', 'dolor', 'sit', 'amet', 'tempor', 'magna', 'aliqua', 'veniam']
  text = ' '.join(rng.choice(words, 200))
  ids = tokenizer.encode(text, add_bos=False)
  return ids[:at] + tokenizer.encode(fact, add_bos=False) + ids[at:]


def test_a_fact_cut_by_a_boundary_is_whole_in_the_routed_installed_page(tiny_model):
  """Pages of 63 text tokens: a 30-byte fact placed across the first boundary is lost by
  plain pages and whole in the page BM25 routes to (and installs) with overlap 32."""
  tokenizer = corpus.ByteTokenizer()
  fact = 'The access code of Zed is 4821'
  fact_ids = tokenizer.encode(fact, add_bos=False)
  doc = _document(tokenizer, fact, at=63 - 12)  # 12 bytes before the boundary, 18 after
  contains = lambda row: fact in paging_scale.decode(tokenizer, row[1:])

  for overlap, whole in ((0, False), (32, True)):
    ids, _ = pages.cut(doc, 64, overlap=overlap, bos=2)
    assert any(contains(row) for row in ids) is whole
    router = route_lib.BM25Router(threshold=0.0)
    router.add_many((str(p), paging_scale.decode(tokenizer, row[1:])) for p, row in enumerate(ids))
    routed = int(router.route('What is the access code of Zed?', k=1)[0].key)
    if not whole:
      continue
    assert contains(ids[routed])
    (page,) = paging_scale.make_pages(
      tiny_model, ids[routed][None], capacity=CAPACITY, chunk_size=CHUNK, local_rows=None
    )
    window = pages.install(
      tiny_model.init_cache(capacity=CAPACITY),
      page,
      target=tiny_model.graft_target,
      config=tiny_model.config,
      chunk_size=CHUNK,
    )
    installed = [int(t) for t in page.block.meta.token_ids]
    at = [i for i in range(64) if installed[i : i + len(fact_ids)] == fact_ids]
    assert at, 'the fact is not whole in the installed page'
    slots = np.arange(at[0], at[0] + len(fact_ids))
    np.testing.assert_array_equal(np.asarray(window.positions)[0, slots], slots)


def test_an_overlapping_page_installs_byte_equal_to_a_fresh_prefill(tiny_model):
  tokenizer = corpus.ByteTokenizer()
  doc = _document(tokenizer, 'The access code of Zed is 4821', at=51)
  ids, cuts = pages.cut(doc, 64, overlap=32, bos=2)
  assert len(cuts) > len(pages.spans(len(doc), 63, 0))
  question = np.asarray(tokenizer.encode('\nQ: code of Zed?\nA:', add_bos=False), np.int32)
  model = tiny_model
  for row in ids[1:3]:  # pages that start inside the text, after an overlap
    (page,) = paging_scale.make_pages(
      model, row[None], capacity=CAPACITY, chunk_size=CHUNK, local_rows=None
    )
    window = pages.install(
      model.init_cache(capacity=CAPACITY),
      page,
      target=model.graft_target,
      config=model.config,
      chunk_size=CHUNK,
    )
    paged, _ = model.prefill(question, cache=window, chunk_size=8, start_position=64, logits='all')
    _, fresh = model.prefill(
      row, cache=model.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='none'
    )
    want, _ = model.prefill(question, cache=fresh, chunk_size=8, start_position=64, logits='all')
    assert _sha(jax.device_get(paged)) == _sha(jax.device_get(want))
