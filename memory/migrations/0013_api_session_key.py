from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0012_langgraph_store_items"),
    ]

    operations = [
        migrations.AddField(
            model_name="session",
            name="key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddConstraint(
            model_name="session",
            constraint=models.UniqueConstraint(
                condition=models.Q(("key__isnull", False)),
                fields=("tenant", "agent", "key"),
                name="session_agent_key_unique",
            ),
        ),
    ]
