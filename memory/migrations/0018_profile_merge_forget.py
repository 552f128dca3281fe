# A merge of two leaves (the forget branch's and the profile branch's 0017); no operations.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0017_forget_content_generation"),
        ("memory", "0017_profile_user_profile_share"),
    ]

    operations = []
