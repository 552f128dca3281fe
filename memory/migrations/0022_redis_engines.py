"""Redis carries the broker, the live updates and the cache in every mode: drop what the
PostgreSQL broker (Kombu's SQLAlchemy transport), the PostgreSQL channel layer (channels_postgres)
and the database cache kept in this database. Each statement is IF EXISTS: an installation that
always ran with REDIS_URL never had them."""

from django.db import migrations

DROP = """
DROP TRIGGER IF EXISTS channels_postgres_notify_trigger ON channels_postgres_message;
DROP FUNCTION IF EXISTS channels_postgres_notify();
DROP TABLE IF EXISTS channels_postgres_groupchannel, channels_postgres_message CASCADE;
DROP TABLE IF EXISTS kombu_message, kombu_queue CASCADE;
DROP SEQUENCE IF EXISTS message_id_sequence, queue_id_sequence;
DROP TABLE IF EXISTS "ctxapp_cache";
DELETE FROM django_migrations WHERE app = 'channels_postgres';
"""


class Migration(migrations.Migration):
    dependencies = [("memory", "0021_recall_defaults")]

    operations = [migrations.RunSQL(DROP, reverse_sql=migrations.RunSQL.noop)]
