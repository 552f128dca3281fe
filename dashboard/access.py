"""Who may see which tenant on the dashboard, and which tenant a request is about.

A member sees the tenants they belong to (memory.models.Membership); staff see every tenant.
The selected tenant lives in the Django session; every page and the websocket re-check
membership on each request, so removing a member takes effect at once.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django_htmx.middleware import HtmxDetails

from dashboard.selectors import id_owner
from memory.models import Membership, Tenant

SESSION_KEY = "dashboard_tenant_id"
# The tenant last picked in this browser outlives the Django session (logging out flushes it),
# so the next login lands on the tenant the user picked, not the first by name.
PICK_COOKIE = "ctxapp_tenant"
PICK_SALT = "dashboard.tenant-pick"
PICK_MAX_AGE = 365 * 24 * 3600


class TenantRequest(HttpRequest):
    """A request that went through `tenant_view`: it carries the selected tenant."""

    tenant: Tenant
    htmx: HtmxDetails


def tenants_for_user(*, user: Any) -> QuerySet[Tenant]:
    """The tenants `user` may see on the dashboard, by name. Read-only."""
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return Tenant.objects.none()
    if user.is_staff:
        return Tenant.objects.all().order_by("name")
    return Tenant.objects.filter(memberships__user=user).order_by("name")


def tenant_for_user(*, user: Any, tenant_id: int | None) -> Tenant | None:
    """The tenant with this pk if `user` may see it, else None (missing and forbidden alike)."""
    if tenant_id is None:
        return None
    return tenants_for_user(user=user).filter(pk=tenant_id).first()


def role_for_user(*, user: Any, tenant: Tenant) -> str:
    """`admin`, `operator` or `viewer`; staff count as admin."""
    if user.is_staff:
        return "admin"
    membership = Membership.objects.filter(user=user, tenant=tenant).only("role").first()
    return membership.role if membership is not None else ""


def selected_tenant(request: HttpRequest) -> Tenant | None:
    """The tenant chosen in this browser session; else the one last picked in this browser (if
    the user may see it); else the user's first tenant. None if they have none."""
    tenant = tenant_for_user(user=request.user, tenant_id=request.session.get(SESSION_KEY))
    if tenant is None:
        picked = request.get_signed_cookie(PICK_COOKIE, default="", salt=PICK_SALT)
        visible = tenants_for_user(user=request.user)
        tenant = (visible.filter(slug=picked).first() if picked else None) or visible.first()
        if tenant is not None:
            request.session[SESSION_KEY] = tenant.pk
    return tenant


def tenant_select(request: HttpRequest, *, slug: str) -> Tenant:
    """Switch this browser session to the tenant `slug`; 404 unless the user may see it."""
    tenant = tenants_for_user(user=request.user).filter(slug=slug).first()
    if tenant is None:
        raise Http404("No such tenant.")
    request.session[SESSION_KEY] = tenant.pk
    return tenant


def tenant_pick_remember(request: HttpRequest, response: HttpResponse, *, tenant: Tenant) -> None:
    """Remember the picked tenant in this browser beyond the session (signed, HTTP-only)."""
    response.set_signed_cookie(
        PICK_COOKIE,
        tenant.slug,
        salt=PICK_SALT,
        max_age=PICK_MAX_AGE,
        httponly=True,
        samesite="Lax",
        secure=request.is_secure(),
    )


def not_found_page(request: TenantRequest, *, message: str, owner: Tenant | None) -> HttpResponse:
    """The dashboard's 404: the page chrome with the tenant switch, what was not found, and the
    user's other tenant that holds it when there is one (switching lands back on this URL)."""
    context = {
        "page": "",
        "tenant": request.tenant,
        "tenants": tenants_for_user(user=request.user),
        "message": message,
        "owner": owner,
    }
    return render(request, "dashboard/not_found.html", context, status=404)


def tenant_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A login-required view that receives `request.tenant` (the selected tenant).

    A user without any tenant gets the 'no tenant' page instead of the view.
    """

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        tenant = selected_tenant(request)
        if tenant is None:
            return render(request, "dashboard/no_tenant.html", status=403)
        request.tenant = tenant  # type: ignore[attr-defined]
        try:
            return view(request, *args, **kwargs)
        except Http404 as exc:
            owner = id_owner(
                tenants=tenants_for_user(user=request.user).exclude(pk=tenant.pk),
                session_id=kwargs.get("session_id"),
                agent_id=kwargs.get("external_id"),
            )
            return not_found_page(request, message=str(exc) or "Not found.", owner=owner)  # type: ignore[arg-type]

    return wrapper
