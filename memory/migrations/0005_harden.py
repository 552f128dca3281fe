"""The database cache table (API throttles without Redis): what `createcachetable` would create."""

from django.db import migrations

CREATE = """
CREATE TABLE IF NOT EXISTS "ctxapp_cache" (
    "cache_key" varchar(255) NOT NULL PRIMARY KEY,
    "value" text NOT NULL,
    "expires" timestamp with time zone NOT NULL
);
CREATE INDEX IF NOT EXISTS "ctxapp_cache_expires" ON "ctxapp_cache" ("expires");
"""


class Migration(migrations.Migration):
    dependencies = [("memory", "0004_recall")]

    operations = [migrations.RunSQL(CREATE, reverse_sql='DROP TABLE IF EXISTS "ctxapp_cache";')]
