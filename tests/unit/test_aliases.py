"""``stalwart.aliases``: which TASKS aliases are Stalwart's, told without importing the
backend."""

import subprocess
import sys

from django.tasks.backends.immediate import ImmediateBackend
from django.utils.module_loading import import_string

from stalwart.aliases import (
    BACKEND_PATH,
    is_stalwart,
    is_stalwart_class,
    stalwart_aliases,
    stalwart_backends,
)
from stalwart.backend import StalwartBackend
from tests.helpers import ROOT


class ProjectBackend(StalwartBackend):
    """A project's own subclass, as some projects write to add a method or two."""


def test_the_path_names_the_backend_class():
    assert import_string(BACKEND_PATH) is StalwartBackend


def test_the_class_and_its_subclasses_are_stalwarts_and_others_are_not():
    assert is_stalwart_class(StalwartBackend)
    assert is_stalwart_class(ProjectBackend)
    assert not is_stalwart_class(ImmediateBackend)
    assert not is_stalwart_class("stalwart.backend.StalwartBackend")  # a path, not a class
    assert is_stalwart(ProjectBackend("custom", {}))
    assert not is_stalwart(ImmediateBackend("immediate", {}))


def test_the_aliases_are_the_stalwart_entries_of_tasks_the_default_first(settings):
    settings.TASKS = {
        "other": {"BACKEND": "tests.unit.test_aliases.ProjectBackend"},
        "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
        "broken": {"BACKEND": "no.such.Backend"},
        "default": {"BACKEND": BACKEND_PATH},
    }
    assert stalwart_aliases() == ["default", "other"]
    assert [backend.alias for backend in stalwart_backends()] == ["default", "other"]


def test_the_low_modules_load_without_the_backend():
    """The catalog, the checks and what they use stand below the backend: importing them
    imports no ``stalwart.backend`` (which would make an import circle of them)."""
    code = (
        "import sys, stalwart.catalog, stalwart.checks, stalwart.binding, stalwart.aliases; "
        "print('stalwart.backend' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False", done.stderr
