import pytest

from stalwart.exceptions import TaskNotFound
from stalwart.resolution import resolve_task
from tests.testapp import tasks


def test_a_task_path_resolves_to_the_task_object():
    assert resolve_task("tests.testapp.tasks.add") is tasks.add


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("os.getcwd", "is a builtin_function_or_method, not a django.tasks task"),
        ("tests.testapp.models.Execution", "is a ModelBase, not a django.tasks task"),
        ("tests.testapp.missing_module.task", "cannot be imported"),
        ("tests.testapp.tasks.no_such_task", "does not exist"),
        ("nodots", "is not a dotted path"),
    ],
)
def test_anything_but_a_task_is_refused(path, reason):
    with pytest.raises(TaskNotFound) as caught:
        resolve_task(path)
    assert reason in str(caught.value)
    assert caught.value.path == path
