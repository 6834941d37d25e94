from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The fault suite's hooks (a raising receiver, a blocking log handler): off unless
        # the scenario sets their environment variables.
        from tests.faults import hooks

        hooks.install()
