import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0014_ordering_search_floor"),
    ]

    operations = [
        migrations.CreateModel(
            name="SharingPolicy",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "share_digests",
                    models.BooleanField(
                        default=False,
                        help_text="A build may be offered (and recall) the digests of the user's sessions with other agents.",
                    ),
                ),
                (
                    "share_messages",
                    models.BooleanField(
                        default=False,
                        help_text="Recall may bring back messages, summaries and tracked facts of the user's sessions with other agents.",
                    ),
                ),
                (
                    "share_experiences",
                    models.BooleanField(
                        default=False,
                        help_text="Tenant-wide experiences recorded by other agents (or by a key bound to none) "
                        "enter builds.",
                    ),
                ),
                (
                    "share_user_memories",
                    models.BooleanField(
                        default=False,
                        help_text="The session user's own memories recorded by other agents (or by a key bound to none) enter builds.",
                    ),
                ),
                (
                    "tenant",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="memory.tenant"
                    ),
                ),
            ],
            options={
                "verbose_name": "sharing policy",
                "verbose_name_plural": "sharing policy",
            },
        ),
    ]
