from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0023_embedding_cache_per_tenant"),
    ]

    operations = [
        migrations.AddField(
            model_name="otelconversation",
            name="history_digest",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddIndex(
            model_name="otelconversation",
            index=models.Index(
                condition=models.Q(("history_digest", ""), _negated=True),
                fields=["tenant", "agent", "history_digest"],
                name="otelconversation_history",
            ),
        ),
    ]
