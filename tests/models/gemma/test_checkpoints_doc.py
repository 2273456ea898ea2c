"""docs/checkpoints.md: its example runs as written."""

import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'checkpoints.md'


def test_example_runs(tmp_path, monkeypatch, capsys):
  code = re.search(r'```python\n(.*?)```', DOC.read_text(), re.S).group(1)
  monkeypatch.chdir(tmp_path)
  exec(compile(code, str(DOC), 'exec'), {})  # noqa: S102 (the documentation's own example)
  assert (tmp_path / 'my-gemma' / 'model.safetensors.index.json').exists()
  printed = capsys.readouterr().out.split()
  assert len(printed[0]) == 16 and printed[1:] == ['(1,', '256)']
