"""`model_flag`: --model takes a name or a checkpoint folder, and a mistyped path is a flag
error naming it (checked when the flags are parsed, before anything loads)."""

from absl import flags
import pytest

from graftjax.studies.common import model_flag


def _parsed(define, *argv):
  values = flags.FlagValues()
  holder = define(values)
  values(['prog', *argv])
  return holder.value


def _model(values, **kwargs):
  return model_flag.define('gemma3-270m', flag_values=values, **kwargs)


def test_a_name_a_random_config_or_a_folder_is_taken(tmp_path):
  assert _parsed(_model) == 'gemma3-270m'
  assert _parsed(_model, '--model=tiny') == 'tiny'
  assert _parsed(_model, f'--model={tmp_path}') == str(tmp_path)
  random = lambda values: _model(values, random=True)
  assert _parsed(random, '--model=gemma4-31b:random') == 'gemma4-31b:random'
  with pytest.raises(flags.IllegalFlagValueError, match=r"one of \['gemma3-270m', 'tiny'\] or"):
    _parsed(_model, '--model=gemma4-31b:random')  # not where random weights are not taken


@pytest.mark.parametrize('value', ['my-gemma-typo', 'gemma3-270m:random:x', 'nope:random'])
def test_a_mistyped_folder_is_a_flag_error_naming_it(tmp_path, value):
  path = tmp_path / value
  with pytest.raises(
    flags.IllegalFlagValueError, match=f'--model={path}: no such checkpoint folder'
  ):
    _parsed(lambda values: _model(values, random=True), f'--model={path}')


def test_a_file_is_not_a_folder(tmp_path):
  (tmp_path / 'model.safetensors').write_bytes(b'')
  with pytest.raises(
    flags.IllegalFlagValueError, match='safetensors: a file, not a checkpoint folder'
  ):
    _parsed(_model, f'--model={tmp_path / "model.safetensors"}')


def test_another_flag_name_and_none():
  router = lambda values: model_flag.define(
    'gemma3-270m', name='router_model', optional=True, flag_values=values
  )
  assert _parsed(router, '--router_model=') == ''
  with pytest.raises(flags.IllegalFlagValueError, match='no such checkpoint folder'):
    _parsed(lambda values: _model(values), '--model=')


def test_a_config_flag_refuses_a_folder_naming_it(tmp_path):
  one = lambda values: model_flag.define_config('gemma3-270m', 'Shapes.', flag_values=values)
  many = lambda values: model_flag.define_config(
    ['tiny'], 'Shapes.', multi=True, flag_values=values
  )
  assert _parsed(one, '--model=gemma3-12b') == 'gemma3-12b'
  assert _parsed(many, '--model=tiny', '--model=gemma3-1b') == ['tiny', 'gemma3-1b']
  with pytest.raises(
    flags.IllegalFlagValueError, match=f'{tmp_path}: this experiment reads a config'
  ):
    _parsed(one, f'--model={tmp_path}')
  with pytest.raises(flags.IllegalFlagValueError, match=f'{tmp_path}: this experiment reads'):
    _parsed(many, '--model=tiny', f'--model={tmp_path}')
  with pytest.raises(flags.IllegalFlagValueError, match='gemma9: no such config'):
    _parsed(one, '--model=gemma9')
