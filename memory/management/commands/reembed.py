"""Re-embed experiences with the configured model (after a model change), or retry failed ones.

python manage.py reembed                 # every experience, in batches, with a progress bar
python manage.py reembed --failed        # only those whose embedding failed
python manage.py reembed --failed --queue  # hand them to the Celery workers instead
python manage.py reembed --tenant alice  # one tenant (slug)
python manage.py reembed --messages      # messages (the memory index) instead of experiences
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from memory.models import Tenant
from memory.services.experiences import experiences_reembed, experiences_retry_failed
from memory.services.message_indexing import messages_reembed


class Command(BaseCommand):
    help = "Re-embed experiences with the configured embedder (progress bar), or retry failed embeddings."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--failed", action="store_true", help="Only experiences whose embedding failed.")
        parser.add_argument("--tenant", help="Only this tenant (slug).")
        parser.add_argument("--batch-size", type=int, default=None, help="Texts per batch.")
        parser.add_argument(
            "--messages",
            action="store_true",
            help="Re-embed messages (the memory index) instead of experiences.",
        )
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
        if options["messages"]:
            drained = messages_reembed(
                tenant=tenant, only_failed=options["failed"], batch_size=options["batch_size"]
            )
            self.stdout.write(
                f"re-embedded {drained.completed} messages in {len(drained.batches)} batches, "
                f"{drained.failed} failed, {drained.skipped} skipped"
            )
            if drained.failed:
                raise CommandError(f"{drained.failed} messages failed to embed; see their embedding error.")
            return
        if options["queue"]:
            if not options["failed"]:
                raise CommandError(
                    "--queue works with --failed; a full re-embed runs here with a progress bar."
                )
            count = experiences_retry_failed(tenant=tenant)
            self.stdout.write(f"queued {count} failed experiences for embedding")
            return
        with tqdm(unit="exp", desc="re-embedding", file=self.stderr._out) as bar:
            result = experiences_reembed(
                only_failed=options["failed"],
                tenant=tenant,
                batch_size=options["batch_size"],
                on_start=lambda total: bar.reset(total=total),
                on_batch=bar.update,
            )
        self.stdout.write(
            f"re-embedded {result.completed} experiences, {result.failed} failed, of {result.total}"
            f" (job {result.job}; progress on the dashboard's jobs page)"
        )
        if result.failed:
            raise CommandError(f"{result.failed} experiences failed to embed; see their embedding error.")
