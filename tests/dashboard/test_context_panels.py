"""The session page's context panels read the tenant's context policy, not fixed numbers."""

from __future__ import annotations

from typing import Any

from django.test import Client

from memory.models import ContextPolicy, Tenant
from memory.services.context import SystemPart, context_build


def test_the_manifest_shades_the_tenants_own_middle_band(
    web_alice: Client, web_bob: Client, tenant_a: Tenant, session_a: Any
) -> None:
    policy = ContextPolicy.for_tenant(tenant_a)
    policy.middle_start, policy.middle_end = 0.1, 0.5
    policy.save(update_fields=["middle_start", "middle_end"])
    # the critical part starts about a quarter of the way in: outside 30-70 %, inside 10-50 %
    built = context_build(
        tenant=tenant_a,
        session=session_a,
        next_input="Please check the pool. " * 60,
        system_parts=[
            SystemPart("style", "Answer briefly and cite the runbook. " * 15),
            SystemPart("safety", "Never restart db-1 during business hours.", critical=True),
        ],
    )
    safety = next(i for i in built.manifest["items"] if i["id"] == "system:safety")
    assert 0.1 < safety["position"] < 0.3 and safety["risky"] is True

    page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    assert "(shaded: 10\u201350 %)" in page and "30\u201370" not in page
    assert "1 in the risky middle" in page
    # the warning names the item as the table does, with its position written as the table writes it
    share = f"{safety['position'] * 100:.0f} %"
    assert f"Critical system: safety sits in the middle of the prompt ({share})" in page
    assert "system:safety" not in page.split('data-testid="manifest-warnings"')[1].split("</ul>")[0]
    # the shaded band of the position strip spans 10 % to 50 % of its 420 px
    assert '<rect class="risky-zone" x="43.0" y="12" width="168.0"' in page
    assert "middle 10-50 %: easily lost" in page

    assert web_bob.get(f"/sessions/{session_a.public_id}/").status_code == 404
