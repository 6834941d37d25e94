import sys

import pytest

from stalwart import catalog
from stalwart.catalog import Catalog, build_catalog
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
        (
            "tests.testapp.missing_module.task",
            "which is not one of the project's task modules",
        ),
        ("tests.testapp.tasks.no_such_task", "does not exist"),
        ("nodots", "is not a dotted path"),
    ],
)
def test_anything_but_a_task_is_refused(path, reason):
    with pytest.raises(TaskNotFound) as caught:
        resolve_task(path)
    assert reason in str(caught.value)
    assert caught.value.path == path


def test_a_path_to_a_module_not_yet_imported_is_refused_without_importing_it():
    assert "this" not in sys.modules  # importing it prints the Zen of Python
    with pytest.raises(TaskNotFound) as caught:
        resolve_task("this.s")
    assert "this" not in sys.modules
    message = str(caught.value)
    assert "never a module named by a job" in message
    assert "Add 'this' to TASKS[...]['OPTIONS']['task_modules']" in message


def test_a_path_into_a_task_module_that_failed_to_import_says_so(monkeypatch):
    failed = {"reports.jobs": ("TASKS['default']['OPTIONS']['task_modules'][0]", "E: boom")}
    monkeypatch.setattr(catalog._loader, "catalog", Catalog(loaded={}, failed=failed))
    with pytest.raises(TaskNotFound) as caught:
        resolve_task("reports.jobs.nightly")
    assert str(caught.value) == (
        "'reports.jobs.nightly' cannot be imported: module 'reports.jobs' (named by "
        "TASKS['default']['OPTIONS']['task_modules'][0]) failed to import: E: boom"
    )


def test_the_catalog_imports_each_named_module_once_and_records_failures(recorded_events):
    built = build_catalog(
        [
            ("tests.testapp.tasks", "app 'testapp'"),
            ("tests.testapp.tasks", "TASKS['default']['OPTIONS']['task_modules'][0]"),
            ("tests.testapp.missing_module", "TASKS['default']['OPTIONS']['task_modules'][1]"),
            ("django.contrib.contenttypes.tasks", "app 'contenttypes'"),  # none: not an error
        ]
    )
    assert built.loaded == {"tests.testapp.tasks": "app 'testapp'"}
    assert list(built.failed) == ["tests.testapp.missing_module"]
    where, error = built.failed["tests.testapp.missing_module"]
    assert where == "TASKS['default']['OPTIONS']['task_modules'][1]"
    assert error.startswith("ModuleNotFoundError: No module named 'tests.testapp.missing_module'")
    assert [action for action, _ in recorded_events] == ["task_module_failed"]


def test_the_project_task_modules_are_the_apps_then_each_backends_settings(settings):
    settings.TASKS = {
        **settings.TASKS,
        "default": {
            **settings.TASKS["default"],
            "OPTIONS": {
                **settings.TASKS["default"]["OPTIONS"],
                "recurring": {
                    "nightly": {"task": "tests.testapp.tasks.noop", "schedule": "@daily"}
                },
                "task_modules": ["tests.testapp.outside_tasks"],
            },
        },
    }
    named = catalog.project_task_modules()
    assert ("tests.testapp.tasks", "app 'testapp'") in named
    assert named[-2:] == [
        ("tests.testapp.tasks", "TASKS['default']['OPTIONS']['recurring']['nightly']"),
        ("tests.testapp.outside_tasks", "TASKS['default']['OPTIONS']['task_modules'][0]"),
    ]
