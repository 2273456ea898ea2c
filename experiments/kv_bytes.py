r"""KV cache bytes per cached token, full-size vs ring sliding-window layers, and slots that fit.

    python experiments/kv_bytes.py --model=tiny --model=gemma3-270m --model=gemma4-e2b \
        --out=experiments/results/kv_bytes/kv_bytes.json \
        --table=experiments/results/kv_bytes/kv_bytes.md

From the configs alone (shapes, no weights, no device): per capacity, each
layout's cache bytes for one batch row (bfloat16 k and v, int32 positions
and segments) per cached token and against the global layers' own bytes;
and the capacity that fits an 80 GB device beside the bfloat16 weights.
Rings take chunks of up to --chunk_size tokens, rounded to the Pallas multiple.
"""

import pathlib

from absl import app
from absl import flags
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.model import kv_bytes
from graftjax.studies.common import results

_MODELS = model_flag.define_config(['tiny', 'gemma3-270m'], 'Configs (repeat).', multi=True)
_CAPACITIES = flags.DEFINE_multi_integer(
  'capacity', list(kv_bytes.CAPACITIES), 'Cache capacities (repeat).'
)
_CHUNK = flags.DEFINE_integer('chunk_size', kv_bytes.Settings.chunk_size, 'Largest ring chunk.')
_DTYPE = flags.DEFINE_enum('dtype', 'bfloat16', ['bfloat16', 'float32'], 'Cache and weight dtype.')
_OUT = flags.DEFINE_string('out', 'experiments/results/kv_bytes/kv_bytes.json', 'Result JSON.')
_TABLE = flags.DEFINE_string(
  'table', 'experiments/results/kv_bytes/kv_bytes.md', 'Markdown table written beside it.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  settings = kv_bytes.Settings(dtype=_DTYPE.value, chunk_size=_CHUNK.value)
  result = kv_bytes.experiment(_MODELS.value, capacities=_CAPACITIES.value, settings=settings)
  table = pathlib.Path(_TABLE.value)
  table.parent.mkdir(parents=True, exist_ok=True)
  table.write_text(kv_bytes.markdown(result))
  results.write(_OUT.value, result, outputs=[table])


if __name__ == '__main__':
  cli.run(main)
