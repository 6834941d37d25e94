from django.apps import AppConfig


class StalwartConfig(AppConfig):
    name = "stalwart"
    label = "stalwart"
    verbose_name = "Stalwart task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from stalwart import log

        log.install()
