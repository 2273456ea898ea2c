"""The flywheel in the chat form (`Prompt.chat`, `--chat`): questions inside the model's
chat template, answers ending at the end of the model's turn.

The model is a tiny export whose tokenizer folder ships a chat template in Gemma 3's format.
"""

import dataclasses
import pathlib

import pytest

from graftjax.flywheel import answer as answer_lib
from graftjax.flywheel import library as library_lib
from graftjax.flywheel import loop
from graftjax.flywheel import rescore
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import safetensors_io
from graftjax.routing import route as route_lib
from graftjax.studies.flywheel import harness
from tests.models.gemma import test_chat_template
from tests.models.gemma import tokenizer_files

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'examples'
START, END = 105, 106


@pytest.fixture(scope='module')
def chat_model(tmp_path_factory):
  vocab = tokenizer_files.small_vocabulary()
  folder = tmp_path_factory.mktemp('tiny-it')
  two = config_lib.attention_pattern(2, local_per_global=1)  # one sliding, one global layer
  source = gemma_model.random(
    config_lib.tiny(vocab_size=vocab.vocab_size, attention_types=two), seed=7
  )
  safetensors_io.save(source.params, source.config, folder)
  tokenizer_files.write_all(folder, vocab, chat_template=test_chat_template.GEMMA3)
  return gemma_model.load(weights=folder)


def test_a_question_in_the_chat_form_is_one_user_turn(chat_model):
  tok = chat_model.tokenizer
  ids = answer_lib.query_ids(chat_model, 'the ant', mode='recall', after_block=False, chat=True)
  text = library_lib.RECALL_QUERY.format(question='the ant')
  want = f'<bos><start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n'
  assert ids == tok.encode(want, add_bos=False) and ids[:2] == [2, START]
  after = answer_lib.query_ids(chat_model, 'the ant', mode='recall', after_block=True, chat=True)
  assert after == ids[1:]  # the block holds the BOS
  plain = answer_lib.query_ids(chat_model, 'the ant', mode='recall', after_block=False)
  assert START not in plain
  assert END in answer_lib.stop_ids(chat_model, 'recall', chat=True)
  assert END not in answer_lib.stop_ids(chat_model, 'recall')


def test_a_model_without_a_template_refuses_the_chat_form(text_model):
  with pytest.raises(ValueError, match='no chat template'):
    answer_lib.query_ids(text_model, 'q', mode='recall', after_block=False, chat=True)


@pytest.mark.slow  # the flywheel on the tiny export
def test_the_flywheel_asks_in_the_chat_form(chat_model, tmp_path, monkeypatch):
  monkeypatch.syspath_prepend(str(EXAMPLES))
  task = harness.load_task('my_task:TASK')
  task = dataclasses.replace(task, prompt=dataclasses.replace(task.prompt, chat=True))
  library = library_lib.Library(tmp_path, shape=library_lib.Shape(capacity=256, chunk_size=16))
  budget = loop.Budget(samples=1, max_new_tokens=4, recall_tokens=4, rows=2)
  routers = [route_lib.BM25Router(threshold=0.0)]
  out = loop.run(chat_model, task, library=library, budget=budget, routers=routers)
  assert out['prompt']['chat'] is True
  phases = [a['phase'] for a in out['attempts']]
  assert phases.count('base') == 3 and phases.count('transfer_flywheel') == 3
  found = rescore.check(out)
  assert not found.problems, found.problems
