from celery.signals import task_prerun
from django.apps import AppConfig, apps
from django.core.signals import request_started
from django.db.backends.signals import connection_created
from django.db.models.signals import post_delete, post_migrate, post_save


class MemoryConfig(AppConfig):
    name = "memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # memory.api.schema registers the OpenAPI auth extension. (The Celery app, which the
        # services send jobs through, is loaded by each process's entry point: ctxapp/asgi.py,
        # the worker and beat, ctxapp/cli/base.py `django_setup`.)
        import memory.api.schema  # noqa: F401  # lazy: django-setup
        from memory.models import ApiKey, Tenant, TenantPolicyBase, policy_cache  # lazy: django-setup
        from memory.services.experience_search import hnsw_connection_configure  # lazy: django-setup
        from memory.services.tenancy import api_keys_changed  # lazy: django-setup

        # Policy rows are read once per process (memory/models/policy_cache.py): any change to one
        # (admin, API, ORM save or delete, a migration) starts a new version of its tenant's.
        for model in apps.get_models():
            if issubclass(model, TenantPolicyBase):
                uid = f"policy-{model.__name__}"
                post_save.connect(policy_cache.policy_saved, sender=model, dispatch_uid=uid)
                post_delete.connect(policy_cache.policy_saved, sender=model, dispatch_uid=f"{uid}-del")
        post_migrate.connect(
            policy_cache.policies_migrated, sender=self, dispatch_uid="policy-cache-migrated"
        )
        # pgvector's search settings once per connection, not one SET LOCAL per search.
        connection_created.connect(hnsw_connection_configure, dispatch_uid="hnsw-settings")

        # Each request and each job reads the versions once, afresh.
        request_started.connect(policy_cache.unit_begin, dispatch_uid="policy-cache-request")
        task_prerun.connect(policy_cache.unit_begin, dispatch_uid="policy-cache-task", weak=False)

        # Any saved or deleted key or tenant (admin, services) drops every process's key cache.
        for model in (ApiKey, Tenant):
            post_save.connect(api_keys_changed, sender=model, dispatch_uid=f"api-key-cache-{model.__name__}")
            post_delete.connect(
                api_keys_changed, sender=model, dispatch_uid=f"api-key-cache-{model.__name__}-del"
            )
