"""The verified-knowledge flywheel: the loop (`loop`: solve, verify, deposit, route, graft,
answer), tasks (`tasks`: the registry; `tasks.gsm8k`, `tasks.qa_wikidata` built in), verifiers.
Its routers are `graftjax.routing`'s and its composition `graftjax.compose`, shared with paging.

Submodules are imported on use (`from graftjax.flywheel import datasets`);
this package imports nothing eagerly. `graftjax.flywheel.Task`, `Item` and
`Prompt` name the task interface (`graftjax.flywheel.tasks`).
"""

_TASK_NAMES = ('Task', 'Item', 'Prompt')


def __getattr__(name: str):
  if name in _TASK_NAMES:
    from graftjax.flywheel import tasks

    return getattr(tasks, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
