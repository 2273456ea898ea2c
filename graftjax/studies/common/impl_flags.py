"""absl flags that choose the kernels of each op: `--impl` and `--<op>_impl`.

    _IMPLS = impl_flags.define(default='pallas')
    model = _IMPLS.apply(model)   # after flag parsing

`--impl` sets every op; `--attention_impl`, `--matmul_impl`, `--norm_impl`
and `--rotary_impl` override it for one op. Only all-'pallas' is
chunk-invariant; mixtures measure what each op costs or changes.
"""

from __future__ import annotations

import dataclasses

from absl import flags

from graftjax.models.gemma import config as config_lib


@dataclasses.dataclass(frozen=True)
class ImplFlags:
  """The holders of --impl and of each op's --<op>_impl (None when not given)."""

  impl: flags.FlagHolder
  per_op: dict[str, flags.FlagHolder]

  @property
  def value(self) -> tuple[str, dict[str, str]]:
    """(impl, {op: impl} for the ops given their own flag): `with_impl`'s arguments."""
    return self.impl.value, {op: f.value for op, f in self.per_op.items() if f.value is not None}

  def apply(self, model):
    """`model` (a `Gemma`) with the kernels the flags choose."""
    impl, per_op = self.value
    return model.with_impl(impl, **per_op)

  def as_json(self) -> dict[str, str]:
    """The implementation of every op, as the parsed flags set it."""
    impl, per_op = self.value
    return {op: per_op.get(op, impl) for op in config_lib.OPS}


def define(default: str, flag_values: flags.FlagValues = flags.FLAGS) -> ImplFlags:
  """Defines --impl (default `default`) and --<op>_impl for every op."""
  impl = flags.DEFINE_enum(
    'impl',
    default,
    list(config_lib.IMPLS),
    'Kernels for every op without its own --<op>_impl.',
    flag_values=flag_values,
  )
  per_op = {
    op: flags.DEFINE_enum(
      f'{op}_impl',
      None,
      list(config_lib.IMPLS),
      f'Kernels for {op} (default: --impl).',
      flag_values=flag_values,
    )
    for op in config_lib.OPS
  }
  return ImplFlags(impl=impl, per_op=per_op)
