"""A tenant's content generation (memory.models.ContentGeneration): what a process-local cache of
the tenant's content compares to know it still holds the truth (memory_search/corpus.py)."""

from __future__ import annotations

from django.db import connection

from memory.models import ContentGeneration, Tenant

__all__ = ["content_generation_bump"]


def content_generation_bump(*, tenant: Tenant | None) -> None:
    """Tell every process that content of `tenant` (None: of every tenant) changed in place.

    Call inside the transaction of the change: the new generation is visible exactly when it is.
    """
    table = ContentGeneration._meta.db_table
    tenant_filter = "" if tenant is None else "WHERE id = %s"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (tenant_id, generation) "
            f"SELECT id, 1 FROM {Tenant._meta.db_table} {tenant_filter} "
            f"ON CONFLICT (tenant_id) DO UPDATE SET generation = {table}.generation + 1",
            [] if tenant is None else [tenant.pk],
        )
