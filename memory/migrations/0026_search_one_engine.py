"""Memory search keeps no word statistics of its own any more (BM25 takes them over the candidate
pool, memory/services/ranking.py): the tenant snapshot tables go. Recall's default `top_k` is
15, the cut nested leave-one-conversation-out chose for the new score scale (docs/memory.md)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("memory", "0025_agent_blob")]

    operations = [
        migrations.DeleteModel(name="SearchTermStat"),
        migrations.DeleteModel(name="SearchTermSnapshot"),
        migrations.AlterField(
            model_name="memorypolicy",
            name="recall_top_k",
            field=models.PositiveIntegerField(
                default=15,
                help_text="Most turns and records a context build recalls; the scores' drop and the budget "
                "usually cut sooner.",
            ),
        ),
    ]
