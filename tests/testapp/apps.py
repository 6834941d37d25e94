import os

from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Faults a test switches on in the processes it starts (a raising receiver, a log
        # handler that blocks, late heartbeat answers): off unless their variables are set.
        from tests.faults import hooks

        hooks.install()
        # A library-style thread in every process (STALWART_TEST_BACKGROUND_THREAD).
        from tests.testapp import background

        background.install()
        if os.environ.get("STALWART_TEST_TASKS_AT_READY") == "true":
            # As a project whose signal receivers import its tasks when its apps are ready.
            from tests.testapp import tasks  # noqa: F401
