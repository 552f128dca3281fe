"""Re-embed experiences with the configured model (after a model change), or retry failed ones.

python manage.py reembed                 # every experience, in batches, with a progress bar
python manage.py reembed --failed        # only those whose embedding failed
python manage.py reembed --failed --queue  # hand them to the Celery workers instead
python manage.py reembed --tenant alice  # one tenant (slug)
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from memory.models import Tenant
from memory.services.experiences import (
    experiences_reembed_batch,
    experiences_reembed_ids,
    experiences_retry_failed,
)


class Command(BaseCommand):
    help = "Re-embed experiences with the configured embedder (progress bar), or retry failed embeddings."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--failed", action="store_true", help="Only experiences whose embedding failed.")
        parser.add_argument("--tenant", help="Only this tenant (slug).")
        parser.add_argument("--batch-size", type=int, default=None, help="Texts per batch.")
        parser.add_argument(
            "--queue",
            action="store_true",
            help="Queue Celery jobs (workers embed) instead of embedding here.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = None
        if options["tenant"]:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"No tenant with slug {options['tenant']!r}.")
        if options["queue"]:
            if not options["failed"]:
                raise CommandError(
                    "--queue works with --failed; a full re-embed runs here with a progress bar."
                )
            count = experiences_retry_failed(tenant=tenant)
            self.stdout.write(f"queued {count} failed experiences for embedding")
            return
        ids = experiences_reembed_ids(only_failed=options["failed"], tenant=tenant)
        size = options["batch_size"] or settings.CTXAPP["CTXAPP_EMBEDDING_BATCH_SIZE"]
        completed = failed = 0
        with tqdm(total=len(ids), unit="exp", desc="re-embedding", file=self.stderr._out) as bar:
            for start in range(0, len(ids), size):
                chunk = ids[start : start + size]
                done, lost = experiences_reembed_batch(experience_ids=chunk)
                completed += done
                failed += lost
                bar.update(len(chunk))
        self.stdout.write(f"re-embedded {completed} experiences, {failed} failed, of {len(ids)}")
        if failed:
            raise CommandError(f"{failed} experiences failed to embed; see their embedding error.")
