import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0024_otel_conversation_history"),
    ]

    operations = [
        migrations.CreateModel(
            name="AgentBlob",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("sha256", models.CharField(max_length=64)),
                ("size", models.PositiveBigIntegerField()),
                ("data", models.BinaryField()),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "agent",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="blobs", to="memory.agent"
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="memory.tenant"
                    ),
                ),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("agent", "sha256"), name="agentblob_unique")],
            },
        ),
    ]
