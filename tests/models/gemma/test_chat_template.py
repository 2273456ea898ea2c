"""Chat templates (models/gemma/chat_template.py): Gemma 3's and Gemma 4's formats to their ids.

The templates are short ones written here from the published formats (ai.google.dev's Gemma
formatting pages: `<start_of_turn>user` ... `<end_of_turn>` for Gemma 3, `<|turn>user` ...
`<turn|>` for Gemma 4, the model's turn opened for generation). The ids are the ones the
gemma library's tokenizers document: BOS 2, the turn's start 105 and its end 106, in both.
"""

import json

import pytest

from graftjax.models.gemma import chat_template
from graftjax.models.gemma import gguf
from graftjax.models.gemma import hf_tokenizer
from graftjax.models.gemma import tokenizer as tokenizer_lib
from tests.models.gemma import tokenizer_files

BOS, START, END = 2, 105, 106


def _template(start: str, end: str) -> str:
  return (
    '{{ bos_token }}'
    '{% for m in messages %}'
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
    f"{{{{ '{start}' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}}}"
    f"{{{{ m['content'] | trim }}}}{{{{ '{end}\\n' }}}}"
    '{% endfor %}'
    f"{{% if add_generation_prompt %}}{{{{ '{start}model\\n' }}}}{{% endif %}}"
  )


GEMMA3 = _template('<start_of_turn>', '<end_of_turn>')
GEMMA4 = _template('<|turn>', '<turn|>')
CASES = {
  'gemma3': (GEMMA3, tokenizer_files.GEMMA3_TURNS),
  'gemma4': (GEMMA4, tokenizer_files.GEMMA4_TURNS),
}
MESSAGES = [
  {'role': 'user', 'content': 'the ant'},
  {'role': 'assistant', 'content': 'the model'},
  {'role': 'user', 'content': 'in there '},
]


def _folder(tmp_path, name, **config):
  template, turns = CASES[name]
  vocab = tokenizer_files.small_vocabulary(turns=turns)
  return vocab, tokenizer_files.write_all(tmp_path / name, vocab, chat_template=template, **config)


@pytest.mark.parametrize('name', sorted(CASES))
@pytest.mark.parametrize('file', hf_tokenizer.FILES)
def test_the_published_formats_render_to_the_documented_ids(tmp_path, name, file):
  _, turns = CASES[name]
  vocab, folder = _folder(tmp_path, name)
  tok = hf_tokenizer.load(folder / file)
  text = tok.chat_template.render(MESSAGES)
  start, end = turns
  assert text == (
    f'<bos>{start}user\nthe ant{end}\n{start}model\nthe model{end}\n'
    f'{start}user\nin there{end}\n{start}model\n'
  )
  ids = tok.encode(text, add_bos=False)
  assert ids == vocab.encode(text, add_bos=False)
  words = lambda t: tok.encode(t, add_bos=False)  # noqa: E731
  newline = words('\n')
  assert ids[:2] == [BOS, START] and ids.count(BOS) == 1
  assert ids.count(START) == 4 and ids.count(END) == 3
  assert ids[-(1 + len(words('model')) + 1) :] == [START, *words('model'), *newline]
  turn = [START, *words('user'), *newline, *words('the ant'), END, *newline]
  assert ids[1 : 1 + len(turn)] == turn
  assert tok.decode(ids) == text
  assert vocab.pieces[START] == start and vocab.pieces[END] == end


def test_wrap_and_end_of_turn_frame_one_question(tmp_path):
  _, folder = _folder(tmp_path, 'gemma4')
  template = hf_tokenizer.load(folder).chat_template
  head, tail = template.wrap()
  assert (head, tail) == ('<bos><|turn>user\n', '<turn|>\n<|turn>model\n')
  assert template.end_of_turn() == '<turn|>'
  assert template.render([{'role': 'user', 'content': 'q'}]) == head + 'q' + tail


def test_the_template_is_found_in_its_file_or_tokenizer_config(tmp_path):
  vocab, folder = _folder(tmp_path, 'gemma3', bos_token='<s>')
  assert chat_template.beside(folder) == chat_template.ChatTemplate(GEMMA3, bos_token='<s>')
  (folder / chat_template.CHAT_TEMPLATE_FILE).write_text(GEMMA4)
  assert chat_template.beside(folder).source == GEMMA4  # the .jinja file first
  listed = tmp_path / 'listed'
  tokenizer_files.write_tokenizer_config(
    listed.mkdir() or listed, vocab, chat_template=[{'name': 'default', 'template': GEMMA3}]
  )
  assert chat_template.beside(listed).source == GEMMA3
  tokenizer_files.write_tokenizer_config(listed, vocab, chat_template=7)
  with pytest.raises(chat_template.ChatTemplateError, match='neither a string'):
    chat_template.beside(listed)
  assert chat_template.beside(tmp_path) is None


def test_a_template_renders_in_a_sandbox_and_its_errors_name_the_cause():
  template = chat_template.ChatTemplate(GEMMA3)
  with pytest.raises(chat_template.ChatTemplateError, match='roles must alternate'):
    template.render([{'role': 'assistant', 'content': 'x'}])
  with pytest.raises(chat_template.ChatTemplateError, match='TemplateSyntaxError'):
    chat_template.ChatTemplate('{% for %}').render([])
  escape = chat_template.ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}")
  with pytest.raises(chat_template.ChatTemplateError, match='SecurityError'):
    escape.render([])
  mutate = chat_template.ChatTemplate("{{ messages.append({'role': 'user'}) }}")
  with pytest.raises(chat_template.ChatTemplateError, match='SecurityError'):
    mutate.render([])
  with pytest.raises(chat_template.ChatTemplateError, match='content once'):
    chat_template.ChatTemplate('{{ bos_token }}').wrap()


def test_gemma3s_format_gives_the_270m_vocabularys_ids():
  """The same template through the real vocabulary (the GGUF's): the documented control ids."""
  vocab = tokenizer_lib.Tokenizer.from_gguf(gguf.locate_gguf())
  text = chat_template.ChatTemplate(GEMMA3).render([{'role': 'user', 'content': 'Hi'}])
  ids = vocab.encode(text, add_bos=False)
  user, model, newline, hi = (vocab.encode(t, add_bos=False) for t in ('user', 'model', '\n', 'Hi'))
  assert ids == [BOS, START, *user, *newline, *hi, END, *newline, START, *model, *newline]
  assert len(user) == len(model) == len(newline) == 1  # one piece each in Gemma 3's vocabulary
  assert json.dumps([vocab.pieces[i] for i in (BOS, START, END)]) == json.dumps(
    ['<bos>', '<start_of_turn>', '<end_of_turn>']
  )
