"""The test settings without ``"stalwart"`` in ``INSTALLED_APPS``: a project that forgot it."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "stalwart"]  # noqa: F405
