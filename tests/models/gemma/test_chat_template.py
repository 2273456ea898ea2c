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


# ---------------------------------------------------------------- bounds of a foreign template

_Error = chat_template.ChatTemplateError


def test_a_template_of_1e10_iterations_stops_at_its_time_bound():
  loops = '{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}'
  with pytest.raises(_Error, match='ran past its bound of 2.0 s'):
    chat_template.ChatTemplate(loops).render([])  # the default bound
  writing = '{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}'
  with pytest.raises(_Error, match='ran past its bound of 0.2 s'):
    chat_template.ChatTemplate(writing, max_seconds=0.2, max_chars=10**12).render([])


def test_recursion_that_writes_nothing_stops_at_its_time_bound():
  doubling = (
    '{% macro f(n) %}{% if n %}{% set a = f(n - 1) %}{% set b = f(n - 1) %}{% endif %}'
    '{% endmacro %}{{ f(40) }}'
  )
  with pytest.raises(_Error, match='ran past its bound'):
    chat_template.ChatTemplate(doubling, max_seconds=0.2).render([])


@pytest.mark.parametrize(
  'source, kind',
  [
    ("{{ 1 + 'a' }}", 'TypeError'),
    ('{{ 1 // 0 }}', 'ZeroDivisionError'),
    ('{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}', 'RecursionError'),
    ('{{ 2.0 ** 10000 }}', 'OverflowError'),
    ('{{ x | tojson }}', 'TypeError'),
    ('{{ 10 ** 5000 }}', 'ValueError'),
  ],
)
def test_every_failure_is_a_chat_template_error_naming_its_kind(source, kind):
  with pytest.raises(_Error, match=f'failed: {kind}'):
    chat_template.ChatTemplate(source).render([])


@pytest.mark.parametrize(
  'source, built',
  [
    ("{{ 'a' * 10 ** 10 }}", "'*'"),
    ('{{ [0] * 10 ** 10 }}', "'*'"),
    ('{{ 10 ** 100000000 }}', "'**'"),
    ("{{ 'a' | center(10 ** 10) }}", 'center'),
    ("{{ 'a'.center(10 ** 10) }}", 'a call'),
    ("{{ '{:>10000000000}'.format('a') }}", 'str.format'),
    ("{{ '%10000000000s' % 'a' }}", "'%'"),
    ("{{ '%10000000000s' | format('a') }}", 'format'),
    ('{{ range(10 ** 10) }}', 'a call'),
    (
      '{% set ns = namespace(s="a") %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}'
      '{% endfor %}',
      '~',
    ),
  ],
)
def test_what_a_template_builds_is_bounded_before_it_is_built(source, built):
  with pytest.raises(_Error, match='past its bound of 4000000') as e:
    chat_template.ChatTemplate(source).render([])
  assert built in str(e.value)


def test_the_rendered_text_is_bounded():
  source = '{% for i in range(50) %}{{ "x" * 100 }}{% endfor %}'
  assert len(chat_template.ChatTemplate(source).render([])) == 5000
  with pytest.raises(_Error, match='the rendered text of .* past its bound of 1000'):
    chat_template.ChatTemplate(source, max_chars=1000).render([])


def test_ordinary_templates_render_and_the_bounds_stay_out_of_the_digest():
  source = "{{ [1, 2] | join(',') }} {{ '%5s' | format(1) }} {{ '{:>3}'.format(1) }} {{ 2 ** 10 }}"
  assert chat_template.ChatTemplate(source).render([]) == '1,2     1   1 1024'
  assert chat_template.ChatTemplate(source, max_seconds=1.0).digest() == (
    chat_template.ChatTemplate(source).digest()
  )


def test_a_tracer_already_installed_is_kept_and_restored():
  import sys

  seen = []

  def tracer(frame, event, arg):
    seen.append(event)
    return None

  sys.settrace(tracer)
  try:
    chat_template.ChatTemplate(_template(*tokenizer_files.GEMMA3_TURNS)).render(
      [{'role': 'user', 'content': 'hi'}]
    )
    assert sys.gettrace() is tracer
  finally:
    sys.settrace(None)
  assert seen  # it went on seeing calls while the template rendered
