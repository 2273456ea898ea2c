"""`--model`, checked when the flags are parsed: a named model or a checkpoint folder.

    _MODEL = model_flag.define('gemma3-270m', ['gemma3-270m', 'tiny'], 'Model to run.')
    _MODEL = model_flag.define('gemma3-270m', model_flag.NAMED, random=True)  # + '<config>:random'
    _MODEL = model_flag.define_config('gemma3-270m', 'Config whose shapes to time.')

An experiment that loads a model takes the path of a checkpoint folder (config.json, weights,
tokenizer.json or tokenizer.model; a `train_small.py` folder) wherever it takes a name, and its
result records the weights' and the tokenizer's digests (`results.model_inputs`). A path that
is not a folder is a flag error naming it, before anything loads. An experiment that reads a
config's shapes only (no weights) takes config names, and a folder there is a flag error too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from absl import flags

from graftjax.models.gemma import config as config_lib

# The names `model.load_named` gives weights to without a suffix.
NAMED = ('gemma3-270m', 'tiny')
RANDOM_SUFFIX = ':random'


def _random_config(value: str) -> bool:
  name = value.removesuffix(RANDOM_SUFFIX)
  return name != value and name in config_lib.NAMED_CONFIGS


def problem(
  value: str, names: Sequence[str], *, random: bool = False, optional: bool = False
) -> str | None:
  """Why `value` is no model for a flag taking `names` (and '<config>:random' if `random`,
  '' if `optional`) or a checkpoint folder (absl's message names the value before it); None
  when it is one."""
  if (
    (optional and value == '')
    or value in names
    or (random and _random_config(value))
    or os.path.isdir(value)
  ):
    return None
  choices = list(names) + (["'<config>:random'"] if random else [])
  if os.path.exists(value):
    return f'a file, not a checkpoint folder: pass one of {choices} or a folder'
  return f'no such checkpoint folder: pass one of {choices} or an existing checkpoint folder'


def define(
  default: str,
  names: Sequence[str] = NAMED,
  help_text: str = 'Model.',
  *,
  random: bool = False,
  name: str = 'model',
  optional: bool = False,
  flag_values: flags.FlagValues = flags.FLAGS,
) -> flags.FlagHolder:
  """`--model` (or `--name`): one of `names`, '<config>:random' for any named config if
  `random`, '' (no model) if `optional`, or the path of a checkpoint folder (which
  `model.load_named` loads, its tokenizer beside it)."""
  none = ' Empty for none.' if optional else ''
  extra = " '<config>:random' (e.g. gemma3-12b:random)," if random else ''
  holder = flags.DEFINE_string(
    name,
    default,
    f'{help_text}{none} One of {", ".join(names)},{extra} or a checkpoint folder'
    ' (config.json, weights, tokenizer.json or tokenizer.model).',
    flag_values=flag_values,
  )

  def check(value: str) -> bool:
    found = problem(value, names, random=random, optional=optional)
    if found:
      raise flags.ValidationError(found)
    return True

  flags.register_validator(name, check, flag_values=flag_values)
  return holder


def define_config(
  default: str | list[str],
  help_text: str,
  *,
  multi: bool = False,
  flag_values: flags.FlagValues = flags.FLAGS,
) -> flags.FlagHolder:
  """`--model` naming a config (`config.NAMED_CONFIGS`) whose shapes an experiment uses, no
  weights; `multi` repeats it. A folder or any other name is a flag error naming it."""
  names = sorted(config_lib.NAMED_CONFIGS)
  define_flag = flags.DEFINE_multi_string if multi else flags.DEFINE_string
  holder = define_flag(
    'model', default, f'{help_text} One of {", ".join(names)}.', flag_values=flag_values
  )

  def check(value) -> bool:
    for one in value if multi else [value]:
      if one in config_lib.NAMED_CONFIGS:
        continue
      if os.path.exists(one):
        raise flags.ValidationError(
          f'{one}: this experiment reads a config by name (shapes only, no weights), not a'
          f' checkpoint folder: pass one of {names}'
        )
      raise flags.ValidationError(f'{one}: no such config: pass one of {names}')
    return True

  flags.register_validator('model', check, flag_values=flag_values)
  return holder
