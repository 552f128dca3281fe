"""Memory search keeps no word statistics of its own any more (BM25 takes them over the candidate
pool, memory/services/ranking.py): the tenant snapshot tables go."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("memory", "0021_recall_defaults")]

    operations = [
        migrations.DeleteModel(name="SearchTermStat"),
        migrations.DeleteModel(name="SearchTermSnapshot"),
    ]
