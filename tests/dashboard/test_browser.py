"""The dashboard in real headless Chromium against a real ASGI server (uvicorn, websockets).

The server runs in a subprocess on the test database (transactional_db: it only sees committed
rows); messages and builds go through the REST API of that server, as an agent would send them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from memory.models import BudgetSample, Membership, MembershipRole, Message, Tenant
from memory.services import sessions as sessions_service
from memory.services.tenancy import api_key_create
from tests.conftest import worker_env
from tests.dashboard.conftest import PASSWORD, make_user
from tests.dashboard.live_server import (
    CHROMIUM,
    CHROMIUM_ARGS,
    uvicorn_server,
)
from tests.environment import chromium_path

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Playwright's sync API runs an event loop in this thread; the ORM calls of the test itself are
# plain blocking calls between browser steps, which is what this flag allows.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def server(transactional_db: None) -> Iterator[str]:
    """The server (uvicorn, the ASGI app) on the test database and the suite's Redis engine."""
    with uvicorn_server(worker_env()) as base:
        yield base


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=chromium_path() or CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Console:
    """Every console error and uncaught page error of one page."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))


def login(browser: Any, base: str, username: str) -> tuple[Any, Console]:
    page = browser.new_page()
    console = Console(page)
    page.goto(f"{base}/")
    assert page.url.startswith(f"{base}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    return page, console


def wait_live(page: Any) -> None:
    page.wait_for_selector("#live-status.on", timeout=10_000)


def server_user(username: str) -> Any:
    """A user whose password the server process can check (it runs the production hashers,
    the test settings only a fast MD5 one)."""
    user = make_user(username)
    hasher = PBKDF2PasswordHasher()
    user.password = hasher.encode(PASSWORD, hasher.salt(), iterations=1000)
    user.save(update_fields=["password"])
    return user


@pytest.fixture
def alice_setup(transactional_db: None) -> dict[str, Any]:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    user = server_user("alice")
    Membership.objects.create(user=user, tenant=tenant, role=MembershipRole.OPERATOR)
    _, secret = api_key_create(tenant=tenant, name="browser test")
    session = sessions_service.session_create(tenant=tenant, agent_external_id="triage-bot", user_id="u-7")
    sessions_service.messages_append(
        tenant=tenant,
        session=session,
        items=[sessions_service.MessageInput(role="user", content="Checkout returns 502 since 09:14.")],
    )
    from memory.services import cognition, experiences

    for reason, decision in [("triage started", "check pool"), ("pool resized", "resize pool to 50")]:
        cognition.checkpoint_create(
            tenant=tenant, agent=session.agent, reason=reason, state={"decision": decision}
        )
    experiences.experience_create(
        tenant=tenant,
        problem="Checkout 502s after deploy",
        cause="upstream pool exhausted",
        solution="roll back",
    )
    return {"tenant": tenant, "key": secret, "session": session}


def test_a_member_watches_a_session_live(alice_setup: dict[str, Any], server: str, browser: Any) -> None:
    session, key = alice_setup["session"], alice_setup["key"]
    page, console = login(browser, server, "alice")
    page.goto(f"{server}/sessions/{session.public_id}/")
    wait_live(page)
    page.evaluate("window.__sameDocument = true")
    assert page.locator("#msg-1").is_visible()
    assert page.locator("[data-testid=budget-empty]").is_visible()
    assert page.locator("[data-testid=manifest-empty]").is_visible()

    api = httpx.Client(base_url=server, headers={"Authorization": f"Bearer {key}"}, timeout=10)
    response = api.post(
        f"/api/v1/sessions/{session.public_id}/messages",
        json={"role": "assistant", "content": "Upstream pool on web-3 is exhausted."},
    )
    assert response.status_code in (200, 201), response.text
    page.wait_for_selector("#msg-2", timeout=2_000)  # the 2 s promise
    assert "Upstream pool on web-3 is exhausted." in page.locator("#msg-2").inner_text()
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    assert Message.objects.filter(session=session).count() == 2

    response = api.post(f"/api/v1/sessions/{session.public_id}/context", json={"input": "What next?"})
    assert response.status_code == 200, response.text
    page.wait_for_selector("[data-testid=budget-gauge]", timeout=2_000)
    page.wait_for_selector("[data-testid=manifest]", timeout=2_000)
    sample = BudgetSample.objects.get(session=session)
    assert page.locator("[data-testid=budget-gauge]").get_attribute("data-used") == str(sample.prompt_tokens)
    assert sample.public_id in page.locator("[data-testid=manifest]").inner_text()
    assert page.evaluate("window.__sameDocument") is True
    assert console.errors == []


def test_a_non_member_is_refused_over_http_and_websocket(
    alice_setup: dict, server: str, browser: Any
) -> None:
    bob_tenant = Tenant.objects.create(name="Bob's team", slug="bob")
    Membership.objects.create(user=server_user("bob"), tenant=bob_tenant)
    session = alice_setup["session"]
    page, _ = login(browser, server, "bob")
    assert "triage-bot" not in page.content()
    response = page.goto(f"{server}/sessions/{session.public_id}/")
    assert response is not None and response.status == 404
    response = page.goto(f"{server}/agents/triage-bot/")
    assert response is not None and response.status == 404
    page.goto(f"{server}/")
    outcome = page.evaluate(
        """(url) => new Promise((resolve) => {
            const ws = new WebSocket(url);
            ws.onopen = () => resolve("open");
            ws.onclose = (e) => resolve("closed " + e.code);
        })""",
        f"ws://127.0.0.1:{server.rsplit(':', 1)[1]}/ws/dashboard/"
        f"?tenant=alice&page=session&session={session.public_id}",
    )
    assert outcome.startswith("closed")
    own = page.evaluate(
        """(url) => new Promise((resolve) => {
            const ws = new WebSocket(url);
            ws.onopen = () => { resolve("open"); ws.close(); };
            ws.onclose = (e) => resolve("closed " + e.code);
        })""",
        f"ws://127.0.0.1:{server.rsplit(':', 1)[1]}/ws/dashboard/?tenant=bob&page=overview",
    )
    assert own == "open"  # the same browser is let in to its own tenant


def test_no_page_logs_a_javascript_error(alice_setup: dict[str, Any], server: str, browser: Any) -> None:
    session = alice_setup["session"]
    trace = "0af7651916cd43dd8448eb211c80319c"
    chat = {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}
    span = {"traceId": trace, "spanId": "b7ad6b7169203331", "name": "chat", "attributes": [chat]}
    exported = httpx.post(
        f"{server}/v1/traces",
        json={"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]},
        headers={"Authorization": f"Bearer {alice_setup['key']}"},
    )
    assert exported.status_code == 200 and exported.json() == {}
    page, console = login(browser, server, "alice")
    pages = [
        f"/traces/{trace}/",
        "/",
        "/sessions/",
        "/agents/",
        f"/sessions/{session.public_id}/",
        "/agents/triage-bot/",
        "/agents/triage-bot/?type=message",
        "/experiences/",
        "/experiences/?q=502+upstream",
        "/jobs/",
    ]
    for path in pages:
        response = page.goto(f"{server}{path}")
        assert response is not None and response.status == 200, path
        if page.locator("[ws-connect]").count():
            wait_live(page)
        page.wait_for_load_state("networkidle")
    page.goto(f"{server}/agents/triage-bot/")
    page.click(".diff-form button[type=submit]")
    page.wait_for_selector("[data-testid=checkpoint-diff] .diff-changed")
    page.click(".timeline a >> nth=1")
    page.wait_for_selector("[data-testid=checkpoint-state]")
    page.goto(f"{server}/experiences/")
    page.fill("input[name=q]", "upstream pool exhausted")
    page.click(".search button[type=submit]")
    page.wait_for_function("() => location.search.includes('q=upstream')")  # answered by htmx, URL pushed
    page.wait_for_selector("[data-testid=search-results]")
    assert "Checkout 502s after deploy" in page.locator("[data-testid=search-results]").inner_text()
    assert console.errors == []


def test_the_overview_follows_new_agents_live(alice_setup: dict[str, Any], server: str, browser: Any) -> None:
    page, console = login(browser, server, "alice")
    wait_live(page)
    assert page.locator("[data-testid=stat-agents]").inner_text() == "1"
    api = httpx.Client(base_url=server, headers={"Authorization": f"Bearer {alice_setup['key']}"}, timeout=10)
    response = api.post("/api/v1/sessions", json={"agent": "night-shift-bot", "user_id": "u-9"})
    assert response.status_code == 201, response.text
    page.wait_for_selector("#panel-overview-agents >> text=night-shift-bot", timeout=2_000)
    page.wait_for_function(
        "() => document.querySelector('[data-testid=stat-agents]').textContent.trim() === '2'", timeout=2_000
    )
    assert "night-shift-bot" in page.locator("#panel-overview-events").inner_text()
    assert console.errors == []


def test_the_message_stream_stays_in_view_beside_the_panels(
    alice_setup: dict[str, Any], server: str, browser: Any
) -> None:
    tenant, session = alice_setup["tenant"], alice_setup["session"]
    sessions_service.messages_append(
        tenant=tenant,
        session=session,
        items=[sessions_service.MessageInput(role="user", content=f"note {n}") for n in range(40)],
    )
    page, console = login(browser, server, "alice")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{server}/sessions/{session.public_id}/")
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    box = page.locator("#messages-panel").bounding_box()
    assert box is not None
    # Scrolled to the bottom of the panels, the messages are still on screen, and fit in it.
    assert box["y"] >= 0 and box["y"] + box["height"] <= 900 + 1
    assert console.errors == []


def test_a_sessions_first_view_shows_more_than_the_budget(
    alice_setup: dict[str, Any], server: str, browser: Any
) -> None:
    session = alice_setup["session"]
    api = httpx.Client(base_url=server, headers={"Authorization": f"Bearer {alice_setup['key']}"}, timeout=10)
    for turn in range(3):
        response = api.post(
            f"/api/v1/sessions/{session.public_id}/messages",
            json={"role": "user", "content": f"Turn {turn}: the pool is full."},
        )
        assert response.status_code in (200, 201), response.text
        response = api.post(f"/api/v1/sessions/{session.public_id}/context", json={"input": "What next?"})
        assert response.status_code == 200, response.text
    page, console = login(browser, server, "alice")
    for width, height in [(1440, 900), (2560, 1440)]:
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{server}/sessions/{session.public_id}/")
        wait_live(page)  # the re-render on connect has replaced the panels: measure what stays
        page.wait_for_load_state("networkidle")
        page.wait_for_selector("[data-testid=budget-gauge]")
        panel = page.locator("[data-testid=budget-panel]").bounding_box()
        messages = page.locator("#messages-panel").bounding_box()
        manifest = page.locator("#panel-session-manifest").bounding_box()
        assert panel is not None and messages is not None and manifest is not None
        # The budget panel is a band, not the whole screen: the messages and the manifest start
        # within the first view, with room to read them.
        assert panel["height"] <= 340, (width, panel)
        assert messages["y"] + 200 <= height and manifest["y"] + 200 <= height, (width, messages, manifest)
        # Chart text keeps its size however wide the screen: no 30 px labels on a wide monitor.
        label = page.locator("[data-testid=budget-gauge] .chart-value").bounding_box()
        assert label is not None and label["height"] <= 16, (width, label)
        print(f"{width}x{height}: budget panel {panel['height']:.0f} px, messages at {messages['y']:.0f} px")
    assert console.errors == []
