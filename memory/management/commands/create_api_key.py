from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from memory.models import Tenant
from memory.services.tenancy import api_key_create


class Command(BaseCommand):
    help = "Create an API key for a tenant and print its secret (shown only once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--name", default="created from the command line")
        parser.add_argument(
            "--scopes", default="", help="comma-separated: read,write,admin (default: read and write)"
        )
        parser.add_argument("--expires-in-days", type=int)
        parser.add_argument("--agent", default="", help="bind the key to this agent (it always acts as it)")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant with slug {options['tenant']!r}.")
        scopes = [s.strip() for s in options["scopes"].split(",") if s.strip()]
        expires = options["expires_in_days"]
        if expires is not None and expires < 1:
            # 0 used to read as "no expiry": a key meant to be short-lived would live forever.
            raise CommandError(
                "--expires-in-days must be 1 or more (leave it out for no expiry).", returncode=2
            )
        try:
            _, secret = api_key_create(
                tenant=tenant,
                name=options["name"],
                scopes=scopes,
                expires_at=timezone.now() + timedelta(days=expires) if expires else None,
                agent_external_id=options["agent"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(secret)
