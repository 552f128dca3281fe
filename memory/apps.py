from django.apps import AppConfig


class MemoryConfig(AppConfig):
    name = "memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Create the Celery app in every Django process so shared_task(...).delay() uses its
        # broker settings (ctxapp/__init__.py no longer imports it eagerly; see ctxapp.client).
        import ctxapp.celery  # noqa: F401
        import memory.api.schema  # noqa: F401  (registers the OpenAPI auth extension)
