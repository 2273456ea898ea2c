r"""Time to first continuation token: graft a stored prefix vs recompute it.

    python experiments/bench_graft.py --prefix_tokens=2048,4096 --repeats=15 \
        --recompute_repeats=1 --recompute_chunks=512,2048,0 \
        --out=experiments/results/graft_speed/bench_graft_cpu.json

For each prefix length N (real text from the Python standard library):
  recompute  new cache, prefill N tokens in chunks, forward the next token,
             at each of --recompute_chunks (0: the prefix in one call); the
             fastest is the recompute, with its prefill tokens/s and model-FLOP
             utilization against the GPU's dense bfloat16 peak (null on CPU);
  graft      read the block from the BlockStore into reused host staging
             (digests verified; `graftjax.restore`), make a new cache,
             install the block in it (in place), forward the next token;
             timed by stage.
Each row sets side by side the first token after a graft over the recompute's,
the block's bytes and the restore over its floor, with the stages of both
(`stages_s`). The restore (read + install) is set against its floors
(`graftjax.studies.graft.restore_floor`): a warm read of the block's files into
touched memory plus the copy into the device (pinned host-to-device on a
GPU, a memcpy on CPU), the same verified with the block's hash as a restore
hashes (BLAKE3 on every core), and the old pageable floor.
The floor and the restore are also timed in turns, round by round, and set
median against median (`restore_floor.side_by_side`, `side_by_side` in each row):
on a CPU shared with other work both sides then meet the same load.
Making the cache and the first forward are costs recompute pays as well.
With `--llamacpp_python`, llama.cpp's own `llama_state_seq_load_file`
restore and its prefill of the same tokens run as the peer (CPU, in that
interpreter). Each graft timing is the median of `--repeats` runs
after one warm-up run (which compiles); recompute runs `--recompute_repeats`
times at each chunk size, after one warm-up at a size the capture did not
compile.
`--local_cache=ring` keeps the sliding-window layers in window-sized rings
(chunks of up to --chunk_size tokens), as a long context at 31B needs.
"""

from graftjax import determinism

determinism.pin()

from absl import app
from absl import flags
from graftjax.studies.graft import bench_graft
from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import results

_MODEL = model_flag.define('gemma3-270m', random=True)
_PREFIX_TOKENS = flags.DEFINE_list(
  'prefix_tokens', ['1024', '4096', '8192', '32768'], 'Prefix lengths.'
)
_RECOMPUTE_MAX = flags.DEFINE_integer(
  'recompute_max', 1 << 30, 'Longest prefix to recompute (longer ones are reported as not run).'
)
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 512, 'Prefill chunk of the stored block.')
_RECOMPUTE_CHUNKS = flags.DEFINE_list(
  'recompute_chunks',
  ['512', '2048', '0'],
  'Chunk sizes the recompute is timed at, the fastest reported (0: the prefix in one call).',
)
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_LOCAL_CACHE = flags.DEFINE_enum(
  'local_cache',
  'full',
  ['full', 'ring'],
  'Sliding-window layers: full-size caches or window rings.',
)
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repeats (median reported).')
_RECOMPUTE_REPEATS = flags.DEFINE_integer(
  'recompute_repeats', None, 'Timed recompute repeats (default: --repeats).'
)
_LLAMACPP_PYTHON = flags.DEFINE_string(
  'llamacpp_python', None, 'Interpreter with llama-cpp-python.'
)
_OUT = flags.DEFINE_string(
  'out', 'experiments/results/graft_speed/bench_graft.json', 'Result JSON.'
)


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
    recompute_repeats=_RECOMPUTE_REPEATS.value,
    local_cache=_LOCAL_CACHE.value,
    recompute_chunks=tuple(int(x) for x in _RECOMPUTE_CHUNKS.value),
  )
  print(bench_graft.format_rows(result))
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
