"""Dashboard pages. Adapters only: resolve the tenant and ids, call selectors/panels, render.

Every view is scoped to the tenant selected in the browser session (dashboard.access); an id
of another tenant answers 404 exactly like a missing one.
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from dashboard import access, capabilities, jobs, panels, selectors
from dashboard.access import TenantRequest
from memory.exceptions import DomainError, NotFound
from memory.models import Agent, Session
from memory.selectors.sessions import agent_get, session_get
from memory.services.forget import forget_user
from memory.services.memory_search import SearchScope
from memory.services.memory_search import memory_search as search


def _session_or_404(request: TenantRequest, session_id: str) -> Session:
    try:
        return session_get(tenant=request.tenant, session_id=session_id)
    except NotFound:
        raise Http404("No such session.") from None


def _agent_or_404(request: TenantRequest, external_id: str) -> Agent:
    try:
        return agent_get(tenant=request.tenant, external_id=external_id)
    except NotFound:
        raise Http404("No such agent.") from None


def _int_or_none(raw: str | None) -> int | None:
    try:
        return int(raw) if raw not in (None, "") else None
    except ValueError:
        raise Http404("Bad page cursor.") from None


def _page(
    request: TenantRequest, template: str, page: str, scope: dict[str, Any], extra: dict[str, Any]
) -> HttpResponse:
    context = {**_chrome(request, page), "panels": panels.page_panels(page, **scope), **extra}
    return render(request, template, context)


def _chrome(request: TenantRequest, page: str) -> dict[str, Any]:
    """What the layout of every page needs: the page's name (for the nav), the tenant and switcher."""
    return {"page": page, "tenant": request.tenant, "tenants": access.tenants_for_user(user=request.user)}


@access.tenant_view
def overview(request: TenantRequest) -> HttpResponse:
    return _page(
        request,
        "dashboard/overview.html",
        "overview",
        {"tenant": request.tenant},
        {"ws_query": "page=overview"},
    )


@login_required
@require_POST
def tenant_switch(request: HttpRequest) -> HttpResponse:
    tenant = access.tenant_select(request, slug=request.POST.get("tenant", ""))
    flash.info(request, f"Now showing {tenant.name}.")
    target = request.POST.get("next", "")
    # Back to the page the switch was made on (the same id in the other tenant), never off-site.
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = reverse("dashboard:overview")
    response = redirect(target)
    access.tenant_pick_remember(request, response, tenant=tenant)
    return response


@access.tenant_view
def sessions_list(request: TenantRequest) -> HttpResponse:
    sessions = selectors.sessions_recent(tenant=request.tenant, limit=100)
    return render(request, "dashboard/sessions.html", {**_chrome(request, "sessions"), "sessions": sessions})


@access.tenant_view
def agents_list(request: TenantRequest) -> HttpResponse:
    agents = selectors.agents_recent(tenant=request.tenant, limit=200)
    return render(request, "dashboard/agents.html", {**_chrome(request, "agents"), "agents": agents})


@access.tenant_view
def session_detail(request: TenantRequest, session_id: str) -> HttpResponse:
    session = _session_or_404(request, session_id)
    page = selectors.messages_page(tenant=request.tenant, session=session)
    return _page(
        request,
        "dashboard/session.html",
        "session",
        {"tenant": request.tenant, "session": session},
        {
            "session": session,
            "messages_page": page,
            "ws_query": urlencode({"page": "session", "session": session.public_id}),
        },
    )


@access.tenant_view
def session_messages(request: TenantRequest, session_id: str) -> HttpResponse:
    """Older messages on demand (htmx): the page before seq `before`, plus the next 'older' button."""
    session = _session_or_404(request, session_id)
    before = _int_or_none(request.GET.get("before"))
    page = selectors.messages_page(tenant=request.tenant, session=session, before=before)
    return render(
        request, "dashboard/partials/_message_page.html", {"session": session, "messages_page": page}
    )


def _user_or_404(request: TenantRequest, user_id: str) -> None:
    if not selectors.user_known(tenant=request.tenant, user_id=user_id):
        raise Http404("No such user.")


@access.tenant_view
def user_detail(request: TenantRequest, user_id: str) -> HttpResponse:
    """What the tenant holds about one user: current memories, their history, the user's sessions,
    and the forget button (admins)."""
    _user_or_404(request, user_id)
    role = access.role_for_user(user=request.user, tenant=request.tenant)
    return _page(
        request,
        "dashboard/user.html",
        "user",
        {"tenant": request.tenant, "user_id": user_id},
        {
            "user_id": user_id,
            "can_forget": role == "admin",
            "ws_query": urlencode({"page": "user", "user": user_id}),
        },
    )


def _receipt_counts(receipt: Any) -> dict[str, Any]:
    """The per-kind counts of a forget receipt, whatever container it comes in."""
    if is_dataclass(receipt) and not isinstance(receipt, type):
        receipt = asdict(receipt)
    if isinstance(receipt, dict):
        counts = receipt.get("counts", receipt)
        return dict(counts) if isinstance(counts, dict) else {}
    return dict(getattr(receipt, "counts", {}) or {})


@access.tenant_view
@require_POST
def user_forget(request: TenantRequest, user_id: str) -> HttpResponse:
    """Erase the user (memory.services.forget.forget_user) once the admin has typed the user id."""
    _user_or_404(request, user_id)
    if access.role_for_user(user=request.user, tenant=request.tenant) != "admin":
        return HttpResponse("Only admins can forget a user.", status=403)
    if request.POST.get("confirm", "") != user_id:
        flash.error(request, f"Nothing was erased: type the user id {user_id!r} exactly to confirm.")
        return redirect("dashboard:user", user_id=user_id)
    receipt = forget_user(tenant=request.tenant, user_id=user_id)
    return render(
        request,
        "dashboard/user_forgotten.html",
        {**_chrome(request, "user"), "user_id": user_id, "counts": _receipt_counts(receipt)},
    )


@access.tenant_view
def agent_detail(request: TenantRequest, external_id: str) -> HttpResponse:
    agent = _agent_or_404(request, external_id)
    filters = selectors.EventFilter(type=request.GET.get("type", ""), session=request.GET.get("session", ""))
    scope = {"tenant": request.tenant, "agent": agent, "filters": filters}
    sessions = selectors.sessions_recent(tenant=request.tenant, agent=agent, limit=10)
    return _page(
        request,
        "dashboard/agent.html",
        "agent",
        scope,
        {
            "agent": agent,
            "sessions": sessions,
            # A filtered log is a snapshot: live updates would replace it with the unfiltered one.
            "ws_query": urlencode(
                {
                    "page": "agent",
                    "agent": agent.external_id,
                    "events": "off" if filters.type or filters.session else "on",
                }
            ),
        },
    )


@access.tenant_view
def agent_events(request: TenantRequest, external_id: str) -> HttpResponse:
    """The filtered, paginated event log panel (htmx)."""
    agent = _agent_or_404(request, external_id)
    filters = selectors.EventFilter(
        type=request.GET.get("type", ""),
        session=request.GET.get("session", ""),
        before=_int_or_none(request.GET.get("before")),
    )
    context = panels.panel_context("agent-events", tenant=request.tenant, agent=agent, filters=filters)
    template = (
        "dashboard/partials/_event_rows.html" if filters.before else panels.PANELS["agent-events"].template
    )
    return render(request, template, {"p": context})


@access.tenant_view
def agent_checkpoint(request: TenantRequest, external_id: str, checkpoint_id: str) -> HttpResponse:
    agent = _agent_or_404(request, external_id)
    checkpoint = capabilities.checkpoint_get(tenant=request.tenant, agent=agent, checkpoint_id=checkpoint_id)
    if checkpoint is None:
        raise Http404("No such checkpoint.")
    return render(
        request, "dashboard/partials/_checkpoint_state.html", {"agent": agent, "checkpoint": checkpoint}
    )


@access.tenant_view
def agent_diff(request: TenantRequest, external_id: str) -> HttpResponse:
    agent = _agent_or_404(request, external_id)
    diff = capabilities.checkpoint_diff(
        tenant=request.tenant,
        agent=agent,
        a=request.GET.get("a", ""),
        b=request.GET.get("b", ""),
    )
    if diff is None:
        raise Http404("No such checkpoint.")
    return render(request, "dashboard/partials/_checkpoint_diff.html", {"agent": agent, "diff": diff})


@access.tenant_view
def experiences(request: TenantRequest) -> HttpResponse:
    query = request.GET.get("q", "").strip()
    user_id = request.GET.get("user", "").strip()
    results = (
        capabilities.experiences_search(tenant=request.tenant, query=query, user_id=user_id)
        if query
        else None
    )
    if request.htmx and query:
        return render(
            request, "dashboard/partials/_experience_results.html", {"results": results, "query": query}
        )
    return _page(
        request,
        "dashboard/experiences.html",
        "experiences",
        {"tenant": request.tenant},
        {"query": query, "user_id": user_id, "results": results, "ws_query": "page=experiences"},
    )


@access.tenant_view
def memory_search(request: TenantRequest) -> HttpResponse:
    """The memory search box of the session and agent pages (htmx partial)."""
    query = request.GET.get("q", "").strip()
    session_id = request.GET.get("session", "").strip()
    agent_id = request.GET.get("agent", "").strip()
    if session_id:
        _session_or_404(request, session_id)
    elif agent_id:
        _agent_or_404(request, agent_id)
    context: dict[str, Any] = {"query": query}
    if not query:
        context["error"] = "Type what to look for."
    else:
        try:
            context["result"] = search(
                tenant=request.tenant,
                query=query,
                scope=SearchScope(session=session_id or None, agent=agent_id or None, sessions="all"),
                limit=20,
            )
        except DomainError as exc:
            context["error"] = str(exc)
    return render(request, "dashboard/partials/_memory_results.html", context)


@access.tenant_view
def jobs_page(request: TenantRequest) -> HttpResponse:
    return _page(
        request, "dashboard/jobs.html", "jobs", {"tenant": request.tenant}, {"ws_query": "page=jobs"}
    )


@access.tenant_view
def jobs_running(request: TenantRequest) -> HttpResponse:
    """Running jobs: the job records taken now, and the workers' view (slow: loaded after the page, htmx)."""
    return render(
        request,
        "dashboard/partials/_jobs_running.html",
        {"running": jobs.running_jobs(tenant=request.tenant)},
    )


@access.tenant_view
@require_POST
def job_retry(request: TenantRequest, event_id: str) -> HttpResponse:
    role = access.role_for_user(user=request.user, tenant=request.tenant)
    if role not in {"admin", "operator"}:
        return HttpResponse("Only operators and admins can retry jobs.", status=403)
    try:
        message = jobs.job_retry(tenant=request.tenant, event_id=event_id)
    except jobs.Event.DoesNotExist:
        raise Http404("No such job.") from None
    except LookupError as exc:
        return HttpResponse(str(exc), status=409)
    return HttpResponse(message)
