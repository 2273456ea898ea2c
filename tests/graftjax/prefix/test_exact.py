"""Reused prefixes are exact: the logits equal a cold prefill's byte for byte at every hit
length (tiny Gemma 3 and Gemma 4 E2B structures), under the Pallas kernels (any
token) and under XLA (rounded to the chunk grid). The models are cut to the fewest layers
that keep their structure (`prefix_cases.lean`)."""

import numpy as np
import pytest
from graftjax.models.gemma import sampler

import prefix_cases as cases


def _hit_lengths(m, lengths):
  reference = cases.cold(m)  # one forward call over the whole prompt
  for stored in lengths:
    engine = cases.engine(m)
    if stored:
      engine.prefill(cases.diverging(cases.IDS, stored))
    out = engine.prefill(cases.IDS, deposit=False)
    assert out.hit == min(stored, cases.N - 1), (stored, out.reasons)
    assert out.logits.tobytes() == reference.tobytes(), f'stored {stored}, hit {out.hit}'


def test_gemma3_every_hit_length_is_byte_equal_to_a_single_pass_prefill():
  _hit_lengths(cases.lean('tiny'), range(0, cases.N + 1))


def test_gemma4_every_hit_length_is_byte_equal_to_a_single_pass_prefill():
  """E2B's structure: kv-sharing layers, whose rows no span stores."""
  _hit_lengths(cases.lean('tiny-gemma4-e2b'), range(0, cases.N + 1))


def test_under_xla_hits_round_down_to_the_chunk_grid_and_equal_a_cold_prefill_on_it():
  m = cases.lean('tiny', 'xla')
  reference = cases.cold(m, chunk_size=cases.CHUNK)
  for stored in range(0, cases.N + 1):
    engine = cases.engine(m)
    if stored:
      engine.prefill(cases.diverging(cases.IDS, stored))
    out = engine.prefill(cases.IDS, deposit=False)
    # Deposits keep whole chunks only; the hit is a multiple of the chunk.
    assert out.hit == min(stored, cases.N - 1) // cases.CHUNK * cases.CHUNK
    assert out.logits.tobytes() == reference.tobytes(), f'stored {stored}'


def test_under_xla_token_granular_hits_would_not_be_exact():
  """Why XLA rounds: a graft at a token off the grid changes the logits' bits."""
  m = cases.lean('tiny', 'xla')
  reference = cases.cold(m, chunk_size=cases.CHUNK)
  _, cache = m.prefill(cases.IDS[:6], cache=m.init_cache(capacity=cases.CAPACITY), chunk_size=4)
  out, _ = m.prefill(cases.IDS[6:], cache=cache, chunk_size=4, start_position=6)
  assert np.asarray(out[0]).tobytes() != reference.tobytes()


def test_a_batch_shares_its_lookups_and_each_prompt_is_exact():
  """The last two prompts hold the same tokens at [16, 20) after different prefixes: each
  keeps its own span (a block's content key names its tokens, not what came before)."""
  m = cases.lean('tiny')
  prompts = [cases.diverging(cases.IDS, s) for s in (20, 13, 9)]
  engine = cases.engine(m)
  outs = engine.prefill_many(prompts)
  assert [o.hit for o in outs] == [0, 13, 9]
  for prompt, out in zip(prompts, outs):
    assert out.logits.tobytes() == cases.cold(m, prompt).tobytes()
  assert outs[2].read_bytes['device'] > 0 and outs[2].read_bytes['store'] == 0


@pytest.mark.parametrize('chunk_size', [3, 8])
def test_pallas_hits_are_exact_whatever_the_chunk_size(chunk_size):
  m = cases.lean('tiny')
  engine = cases.engine(m, chunk_size=chunk_size)
  engine.prefill(cases.diverging(cases.IDS, 11))
  out = engine.prefill(cases.IDS, deposit=False)
  assert out.hit == 11
  assert out.logits.tobytes() == cases.cold(m).tobytes()


def test_generate_deposits_its_answer_and_the_next_turn_reuses_it_exactly():
  """Under Pallas a decode step computes a prefill's bits: the answer's rows are spans too."""
  m = cases.lean('tiny')
  engine = cases.engine(m)
  first = engine.generate(cases.IDS[:12], max_new_tokens=4, stop_ids=())
  turn = np.concatenate([cases.IDS[:12], first['tokens'], [7, 8]]).astype(np.int32)
  second = engine.generate(turn, max_new_tokens=4, stop_ids=(), keep_logits=True)
  assert second['prefill'].hit == 12 + 3  # the prompt and every answer token but the last
  cold = sampler.generate(
    m, turn, max_new_tokens=4, capacity=cases.CAPACITY, stop_ids=(), keep_logits=True
  )
  assert second['tokens'] == cold['tokens']
  assert second['logits'].tobytes() == cold['logits'].tobytes()
