r"""Do the Pallas kernels give the same bits in another process and another device call?

    python experiments/kernel_determinism.py --label=call1_a --out=/tmp/det_a.json
    python experiments/kernel_determinism.py --label=call1_b --out=/tmp/det_b.json
    # ... in a later device call:
    python experiments/kernel_determinism.py --label=call2 --out=/tmp/det_c.json
    python experiments/kernel_determinism.py --merge=/tmp/det_a.json,/tmp/det_b.json,/tmp/det_c.json \
        --out=experiments/results/kernel_determinism/kernel_determinism_h200.json

A run computes, from inputs drawn with fixed seeds, the SHA-256 of every
kernel's output bytes (attention plain, sliding-window, with segments, ALiBi
and rope_relative; rotary; rms_norm; matmul; float32 and bfloat16) and of the
logits of `--model` under impl=pallas on `--samples` text samples (a kernel
that fails is listed under `errors`, not digested). `--merge`
checks each run's digest, that all runs used one configuration (flags, jax,
device), and reports every output whose digest differs between runs.
`--quick` uses small shapes (CPU interpret mode, for tests).
"""

from graftjax import determinism

determinism.pin()  # before jax starts

from absl import app
from absl import flags
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.kernels import kernel_determinism
from graftjax.studies.common import results

_MODEL = model_flag.define('gemma3-270m', ['gemma3-270m', 'tiny'], 'Model run under pallas.')
_SAMPLES = flags.DEFINE_integer('samples', 2, 'Text samples whose logits are digested.')
_PREFIX_TOKENS = flags.DEFINE_integer('prefix_tokens', 64, 'Tokens per sample.')
_LABEL = flags.DEFINE_string('label', 'run', 'Name of this run (e.g. which call and process).')
_QUICK = flags.DEFINE_bool('quick', False, 'Small kernel shapes (CPU interpret mode).')
_MERGE = flags.DEFINE_list('merge', [], 'Run files to compare (runs nothing).')
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/kernel_determinism/kernel_determinism.json', 'Result JSON.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if _MERGE.value:
    result = kernel_determinism.merge(_MERGE.value, results.command_line())
    print(
      f'{len(result["runs"])} runs, {result["outputs"]} outputs:'
      f' {"all identical" if result["identical"] else "differing: " + ", ".join(result["differing"])}'
    )
  else:
    result = kernel_determinism.experiment(
      model_name=_MODEL.value,
      samples=_SAMPLES.value,
      prefix_tokens=_PREFIX_TOKENS.value,
      label=_LABEL.value,
      quick=_QUICK.value,
    )
    print(f'{len(result["digests"])} outputs digested on {result["determinism"]["device_kind"]}')
  if result['errors']:
    print(f'errors: {result["errors"]}')
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
