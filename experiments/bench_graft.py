r"""Time to first continuation token: graft a stored prefix vs recompute it.

    python experiments/bench_graft.py --prefix_tokens=1024,4096,8192,32768 \
        --llamacpp_python=/path/to/python-with-llama-cpp \
        --out=experiments/results/bench_graft_cpu.json

For each prefix length N (real text from the Python standard library):
  recompute  new cache, prefill N tokens in chunks, forward the next token;
  graft      read the block from the BlockStore (digests verified), make a
             new cache, install the block in it (in place), forward the
             next token; timed by stage.
The restore (read + install) is set against its floor: the block's bytes
over this machine's measured bandwidth, a warm read of the block's files
(plus a host-to-device copy on an accelerator). Making the cache and the
first forward are costs recompute pays as well. On CPU, llama.cpp's own `llama_state_seq_load_file` restore
and its prefill of the same tokens run as the peer (in another interpreter,
`--llamacpp_python`). Each timing is the median of `--repeats` runs after
one warm-up run (which compiles).
"""

from graftjax import determinism

determinism.pin()

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
from graftjax.studies import bench_graft
from graftjax.studies import cli
from graftjax.studies import results

_MODEL = flags.DEFINE_enum('model', 'gemma3-270m', ['gemma3-270m', 'tiny'], 'Model.')
_PREFIX_TOKENS = flags.DEFINE_list(
  'prefix_tokens', ['1024', '4096', '8192', '32768'], 'Prefix lengths.'
)
_RECOMPUTE_MAX = flags.DEFINE_integer(
  'recompute_max', 1 << 30, 'Longest prefix to recompute (longer ones are reported as not run).'
)
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 512, 'Prefill chunk.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repeats (median reported).')
_LLAMACPP_PYTHON = flags.DEFINE_string(
  'llamacpp_python', None, 'Interpreter with llama-cpp-python.'
)
_OUT = flags.DEFINE_string('out', 'experiments/results/bench_graft.json', 'Result JSON.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = bench_graft.experiment(
    model_name=_MODEL.value,
    dtype=_DTYPE.value,
    lengths=[int(x) for x in _PREFIX_TOKENS.value],
    chunk_size=_CHUNK_SIZE.value,
    repeats=_REPEATS.value,
    recompute_max=_RECOMPUTE_MAX.value,
    llamacpp_python=_LLAMACPP_PYTHON.value,
  )
  print(bench_graft.format_rows(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
