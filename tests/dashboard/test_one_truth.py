"""The session and agent pages tell one truth: one budget share, one colour per component, items
named and in prompt order, decay by risk, a readable recovered state, tenants that stay picked.

Every test renders the real pages from real builds on the test database.
"""

from __future__ import annotations

import re
from typing import Any

from django.test import Client

from memory.models import DecayPolicy, Membership, Tenant
from memory.services import cognition, context, decay
from memory.services import sessions as sessions_service
from tests.dashboard.conftest import PASSWORD

SMALL_WINDOW = {"max_input_tokens": 600, "output_reserve": 64}


def talk(tenant: Tenant, session: Any, turns: int, text: str = "the pool on web-3 is at 20 of 20") -> None:
    for turn in range(turns):
        sessions_service.messages_append(
            tenant=tenant,
            session=session,
            items=[
                sessions_service.MessageInput(role="user", content=f"Turn {turn}: {text}."),
                sessions_service.MessageInput(role="assistant", content=f"Turn {turn}: checking the logs."),
            ],
        )


def between(page: str, start: str, end: str) -> str:
    return page.split(start, 1)[1].split(end, 1)[0]


def test_the_gauge_the_manifest_and_its_warning_give_one_budget_share(
    web_alice: Client, tenant_a: Tenant, session_a: Any
) -> None:
    talk(tenant_a, session_a, 12)
    built = context.context_build(
        tenant=tenant_a, session=session_a, next_input="next?", overrides=SMALL_WINDOW
    )
    assert "near_limit" in [w["code"] for w in built.warnings]  # the engine warned in its own terms
    page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()

    share = f"{built.budget['prompt_tokens'] / built.budget['input_limit'] * 100:.1f} %"
    assert re.search(r'data-share="([^"]+)"', page)[1] == share  # type: ignore[index]
    assert between(page, 'data-testid="budget-share">', "<") == share
    assert between(page, 'data-testid="manifest-share">', "<") == share
    assert f"· {share}</text>" in page  # the figure drawn on the gauge
    warnings = between(page, 'data-testid="manifest-warnings">', "</ul>")
    assert f"({share})" in warnings and "budget tokens" not in page
    # every percentage the budget panel and the manifest print is that one
    shares = set(re.findall(r"\d+(?:\.\d+)? ?%", between(page, 'data-testid="manifest"', "<h3>")))
    assert shares == {share}


def stacked_colours(page: str) -> dict[str, str]:
    return dict(
        (name, fill)
        for fill, name in re.findall(r'fill="(#[0-9a-f]{6})"><title>([a-z_]+): \d+ tokens</title>', page)
    )


def test_each_component_keeps_its_colour_in_every_session(
    web_alice: Client, tenant_a: Tenant, session_a: Any
) -> None:
    other = sessions_service.session_create(tenant=tenant_a, agent_external_id="triage-bot")
    talk(tenant_a, other, 2)
    decay.fact_register(
        tenant=tenant_a, session=session_a, key="deploy_window", fact_type="constraint", content="No restarts"
    )
    context.context_build(
        tenant=tenant_a,
        session=session_a,
        next_input="next?",
        system_parts=[context.SystemPart("style", "Answer briefly.")],
    )
    context.context_build(tenant=tenant_a, session=other, next_input="next?")
    first = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    second = web_alice.get(f"/sessions/{other.public_id}/").content.decode()

    one, two = stacked_colours(first), stacked_colours(second)
    assert {"system", "pinned_facts", "history"} <= one.keys() and "pinned_facts" not in two
    # history is drawn third in the first session and first in the second: the same colour
    assert one["history"] == two["history"] and one["input"] == two["input"]
    assert len(set(one.values())) == len(one)  # no two components share a colour
    # the manifest's rows carry their component's colour too
    history_rows = re.findall(
        r'data-colour="(#[0-9a-f]{6})"><svg[^>]*><rect[^>]*/></svg></span> history', first
    )
    assert history_rows and set(history_rows) == {one["history"]}


def test_the_manifest_names_items_and_lists_them_in_prompt_order(
    web_alice: Client, tenant_a: Tenant, session_a: Any
) -> None:
    registered = decay.fact_register(
        tenant=tenant_a, session=session_a, key="deploy_window", fact_type="constraint", content="No restarts"
    )
    context.context_build(
        tenant=tenant_a,
        session=session_a,
        next_input="What next?",
        system_parts=[
            context.SystemPart("style", "Answer briefly and cite the runbook. " * 10),
            context.SystemPart("safety", "Never restart db-1.", critical=True),
        ],
    )
    page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    table = between(page, '<table class="manifest">', "</table>")
    labels = re.findall(r'<tr[^>]*data-testid="manifest-item"><td title="([^"]+)"', table)
    assert labels[:2] == ["system: style", "system: safety"]
    assert "fact deploy_window" in labels and "msg #1" in labels and "msg #2" in labels
    assert labels[-1] == "next input"
    assert registered.fact.public_id not in table  # the internal id is not what a person reads
    positions = [int(p) for p in re.findall(r'data-testid="manifest-position">(\d+) %', table)]
    assert len(positions) == len(labels) and positions == sorted(positions) and positions[0] == 0


def test_an_ended_session_forecasts_no_more_turns(
    web_alice: Client, tenant_a: Tenant, session_a: Any
) -> None:
    for _ in range(3):
        talk(tenant_a, session_a, 1)
        context.context_build(tenant=tenant_a, session=session_a, next_input="next?")
    open_page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    assert "until the summarisation threshold" in between(open_page, 'data-testid="forecast">', "</p>") or (
        "no threshold in sight" in between(open_page, 'data-testid="forecast">', "</p>")
    )
    sessions_service.session_end(tenant=tenant_a, session=session_a)
    page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    forecast = between(page, 'data-testid="forecast">', "</p>")
    assert forecast == "The session is ended: no further turns, so no forecast."


def test_decay_lists_the_fact_at_risk_first_and_says_what_it_counts(
    web_alice: Client, tenant_a: Tenant, session_a: Any
) -> None:
    policy = DecayPolicy.for_tenant(tenant_a)
    policy.decay_rounds, policy.decay_rounds_high = 8, 10
    policy.save(update_fields=["decay_rounds", "decay_rounds_high"])
    decay.fact_register(
        tenant=tenant_a, session=session_a, key="zz_note", fact_type="note", content="Grafana is slow"
    )
    talk(tenant_a, session_a, 6, text="nothing about dashboards here")
    for key in ("a_rule", "b_rule", "c_rule"):
        decay.fact_register(
            tenant=tenant_a, session=session_a, key=key, fact_type="constraint", content=f"{key} holds"
        )
    page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    table = between(page, 'data-testid="facts"', "</table>")
    states = re.findall(r'data-testid="fact-row" data-state="([a-z_]+)"><td title="[^"]*">([a-z_]+)<', table)
    assert states[0] == ("at_risk", "zz_note")  # the low-importance fact nearly decayed, not 4th
    assert [s for s, _ in states[1:]] == ["fresh"] * 3
    assert "6 of 8 turns" in table and '<td class="nowrap"><span class="badge decay-at_risk">' in table
    assert "counts user turns" in between(page, 'data-testid="facts-caption">', "</p>")


def test_the_recovered_state_reads_as_a_summary_with_the_document_on_expand(
    web_alice: Client, tenant_a: Tenant, session_a: Any
) -> None:
    agent = session_a.agent
    cognition.checkpoint_create(
        tenant=tenant_a, agent=agent, reason="triage started", state={"context": {"goal": "fix 502s"}}
    )
    sessions_service.task_create(tenant=tenant_a, session=session_a, title="Resize the pool")
    page = web_alice.get("/agents/triage-bot/").content.decode()
    summary = between(page, 'data-testid="recovered-summary"', "</dl>")
    assert between(summary, 'data-testid="recovered-goal">', "</dd>") == "fix 502s"
    assert "#1 — triage started" in summary
    assert "Resize the pool" in between(summary, 'data-testid="recovered-tasks">', "</dd>")
    assert "Task" in between(summary, 'data-testid="recovered-events">', "</dd>")
    # the JSON is there, folded: inside <details>, after the summary
    details = page.split('<details class="json-details">', 1)[1].split("</details>", 1)[0]
    assert 'data-testid="recovered-state"' in details and "&quot;operational&quot;" in details


def test_login_lands_on_the_tenant_picked_last(
    client: Client, alice: Any, tenant_a: Tenant, tenant_b: Tenant
) -> None:
    Membership.objects.create(user=alice, tenant=tenant_b)
    client.post("/login/", {"username": "alice", "password": PASSWORD})
    assert "Alice&#x27;s team</option>" in client.get("/").content.decode()
    client.post("/tenant/switch", {"tenant": tenant_b.slug, "next": "/sessions/"})
    client.post("/logout/")
    response = client.post("/login/", {"username": "alice", "password": PASSWORD})
    assert response.status_code == 302
    page = client.get("/").content.decode()
    assert '<option value="bob" selected>' in page and "Overview <small>Bob&#x27;s team" in page


def test_the_switch_returns_to_the_same_page_and_never_off_site(
    web_alice: Client, alice: Any, tenant_b: Tenant
) -> None:
    Membership.objects.create(user=alice, tenant=tenant_b)
    assert web_alice.post("/tenant/switch", {"tenant": "bob", "next": "/jobs/"})["Location"] == "/jobs/"
    evil = web_alice.post("/tenant/switch", {"tenant": "alice", "next": "https://evil.example/"})
    assert evil["Location"] == "/"


def test_another_tenants_url_answers_a_styled_404_with_the_tenant_switch(
    web_bob: Client, alice: Any, tenant_b: Tenant, session_a: Any
) -> None:
    url = f"/sessions/{session_a.public_id}/"
    response = web_bob.get(url)
    page = response.content.decode()
    assert response.status_code == 404
    assert 'data-testid="not-found"' in page and 'data-testid="tenant-switcher"' in page
    assert "dashboard.css" in page and "Bob&#x27;s team" in page
    assert 'data-testid="owner-switch"' not in page and "Alice" not in page  # Bob may not see A

    # Alice, a member of both, looking at it from Bob's team is offered the tenant that holds it
    Membership.objects.create(user=alice, tenant=tenant_b)
    web = Client()
    web.force_login(alice)
    web.post("/tenant/switch", {"tenant": "bob"})
    page = web.get(url).content.decode()
    offer = between(page, 'data-testid="owner-switch">', "</form>")
    assert 'name="tenant" value="alice"' in offer and f'name="next" value="{url}"' in offer
    assert web.post("/tenant/switch", {"tenant": "alice", "next": url})["Location"] == url
    assert web.get(url).status_code == 200


def test_an_unknown_page_answers_a_styled_404(web_alice: Client) -> None:
    response = web_alice.get("/no-such-page/")
    page = response.content.decode()
    assert response.status_code == 404
    assert 'data-testid="not-found"' in page and "dashboard.css" in page and "/no-such-page/" in page
