from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class MemoryConfig(AppConfig):
    name = "memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Create the Celery app in every Django process so shared_task(...).delay() uses its
        # broker settings (ctxapp/__init__.py no longer imports it eagerly; see ctxapp.client).
        # memory.api.schema registers the OpenAPI auth extension.
        import ctxapp.celery  # noqa: F401  # lazy: django-setup
        import memory.api.schema  # noqa: F401  # lazy: django-setup
        from memory.models import ApiKey, Tenant  # lazy: django-setup
        from memory.services.tenancy import api_keys_changed  # lazy: django-setup

        # Any saved or deleted key or tenant (admin, services) drops every process's key cache.
        for model in (ApiKey, Tenant):
            post_save.connect(api_keys_changed, sender=model, dispatch_uid=f"api-key-cache-{model.__name__}")
            post_delete.connect(
                api_keys_changed, sender=model, dispatch_uid=f"api-key-cache-{model.__name__}-del"
            )
