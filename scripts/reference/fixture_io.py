"""Writing the reference fixtures: compact, one prompt per line, float32 exact.

Float32 logits are written with the shortest decimal that reads back to the
same float32 (`str(np.float32(x))`), so `np.float32(json_value)` recovers the
reference bits; float64 log-sum-exps are written with Python's repr.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shlex
import sys
from typing import Any

import numpy as np

FORMAT = 'graftjax.reference_logits.v1'
TOP_K = 20
GREEDY_STEPS = 32
# Fixtures ship beside the tests; scripts sit two folders below the root.
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / 'tests' / 'fixtures'
HF_FIXTURE = FIXTURES / 'hf_reference.json'
LLAMACPP_FIXTURE = FIXTURES / 'llamacpp_reference.json'


def f32_list(values) -> list[float]:
  """Float32 values as the shortest decimals that round-trip to float32."""
  return [float(str(v)) for v in np.asarray(values, dtype=np.float32).ravel()]


def f64_list(values) -> list[float]:
  return [float(v) for v in np.asarray(values, dtype=np.float64).ravel()]


def command_line() -> str:
  """The command that ran this script, relative to the repository root."""
  script = pathlib.Path(sys.argv[0]).resolve()
  try:
    script = script.relative_to(REPO_ROOT)
  except ValueError:
    pass
  return shlex.join([sys.executable, str(script), *sys.argv[1:]])


def sha256_file(path: pathlib.Path | str) -> str:
  return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def write(path: pathlib.Path, header: dict[str, Any], prompts: list[dict[str, Any]]):
  """Writes `header` indented and each prompt record compact on one line."""
  head = json.dumps({**header, 'prompts': []}, indent=1)
  if not head.endswith('"prompts": []\n}'):
    raise AssertionError('unexpected header layout')
  lines = [json.dumps(p, separators=(',', ':'), ensure_ascii=False) for p in prompts]
  body = head[: -len('[]\n}')] + '[\n' + ',\n'.join(lines) + '\n ]\n}\n'
  json.loads(body)  # Round-trip check before anything is written.
  tmp = path.with_suffix('.json.tmp')
  tmp.write_text(body, encoding='utf-8')
  tmp.replace(path)
