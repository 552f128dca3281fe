"""The embedding cache is keyed by tenant: (tenant, model, text hash); API keys are labelled so.

The rows shared across tenants cannot be given a tenant (any tenant holding the text may have
filled one), so they are dropped: the cache refills as texts are embedded again, and every
message, experience and user memory keeps the vector stored on its own row.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("memory", "0022_redis_engines")]

    operations = [
        migrations.AlterModelOptions(
            name="apikey",
            options={"ordering": ["-created_at"], "verbose_name": "API key", "verbose_name_plural": "API keys"},
        ),
        migrations.RunSQL("DELETE FROM memory_embeddingcache", reverse_sql=migrations.RunSQL.noop),
        migrations.RemoveConstraint(model_name="embeddingcache", name="embedding_cache_model_text_unique"),
        migrations.AddField(
            model_name="embeddingcache",
            name="tenant",
            field=models.ForeignKey(
                default=None,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="memory.tenant",
            ),
            preserve_default=False,
        ),
        migrations.AddConstraint(
            model_name="embeddingcache",
            constraint=models.UniqueConstraint(
                fields=("tenant", "model", "text_hash"), name="embedding_cache_tenant_model_text_unique"
            ),
        ),
    ]
