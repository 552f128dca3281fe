"""The key-value store: values under (namespace, key), found by key, by namespace and filter, or
by meaning (LangGraph's BaseStore contract; ctxapp/integrations/langgraph_store.py is its client).

Each owner (the agent a bound key acts as, "" for the tenant's unbound keys) has a store of its
own. Search by meaning embeds the query and each item's `texts` with ctxapp's embedder, through
the shared embedding cache (each text embedded once ever), and ranks by cosine, an item scoring
its best text; items without texts follow, unscored. Items past their TTL are never answered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from memory.exceptions import InvalidInput
from memory.models import StoreItem, Tenant
from memory.services.embedding import EmbedderError, cosines_cached, embed_query

NAMESPACE_JOIN = "\x1f"  # a label never holds it (refused below)
FILTER_OPERATORS = {"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"}


@dataclass(frozen=True)
class StoreScope:
    """Whose store: the tenant and the owner (bound agent, or "")."""

    tenant: Tenant
    owner: str = ""


@dataclass(frozen=True)
class Put:
    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any] | None  # None deletes
    texts: list[str] = field(default_factory=list)
    ttl_minutes: float | None = None


@dataclass(frozen=True)
class Search:
    namespace_prefix: tuple[str, ...]
    filter: dict[str, Any] | None = None
    limit: int = 10
    offset: int = 0
    query: str | None = None
    refresh_ttl: bool = True


@dataclass(frozen=True)
class ListNamespaces:
    prefix: tuple[str, ...] | None = None
    suffix: tuple[str, ...] | None = None
    max_depth: int | None = None
    limit: int = 100
    offset: int = 0


def namespace_check(namespace: tuple[str, ...], *, field_name: str = "namespace") -> None:
    """Refuse a namespace LangGraph would refuse: empty labels, '.' or the join character."""
    for label in namespace:
        if not label or "." in label or NAMESPACE_JOIN in label:
            raise InvalidInput(
                f"A namespace label is a non-empty string without '.'; got {label!r}.",
                details={"fields": {field_name: ["Labels are non-empty and hold no '.'."]}},
            )


def _path(namespace: tuple[str, ...]) -> str:
    return NAMESPACE_JOIN.join(namespace)


def _live(scope: StoreScope) -> Any:
    now = timezone.now()
    return StoreItem.objects.filter(tenant=scope.tenant, owner=scope.owner).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    )


def _refresh(items: list[StoreItem]) -> None:
    """Move the expiry of items read with refresh on, each by its own TTL."""
    now = timezone.now()
    for item in items:
        if item.ttl_minutes is not None:
            item.expires_at = now + timedelta(minutes=item.ttl_minutes)
            StoreItem.objects.filter(pk=item.pk).update(expires_at=item.expires_at)


def store_get(
    *, scope: StoreScope, namespace: tuple[str, ...], key: str, refresh_ttl: bool
) -> StoreItem | None:
    item = _live(scope).filter(namespace_path=_path(namespace), key=key).first()
    if item is not None and refresh_ttl:
        _refresh([item])
    return item


def store_put(*, scope: StoreScope, put: Put) -> None:
    """Write (or with value None, delete) one item. A re-put keeps its created_at."""
    namespace_check(put.namespace)
    rows = StoreItem.objects.filter(
        tenant=scope.tenant, owner=scope.owner, namespace_path=_path(put.namespace), key=put.key
    )
    if put.value is None:
        rows.delete()
        return
    now = timezone.now()
    expires = now + timedelta(minutes=put.ttl_minutes) if put.ttl_minutes is not None else None
    changed = {"value": put.value, "texts": put.texts, "updated_at": now}
    changed |= {"ttl_minutes": put.ttl_minutes, "expires_at": expires}
    StoreItem.objects.update_or_create(
        tenant=scope.tenant,
        owner=scope.owner,
        namespace_path=_path(put.namespace),
        key=put.key,
        defaults=changed,
        create_defaults={**changed, "namespace": list(put.namespace), "created_at": now},
    )


def _operator(value: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return bool(value == operand)
    if operator == "$ne":
        return bool(value != operand)
    try:
        left, right = float(value), float(operand)
    except (TypeError, ValueError):
        return False
    return {"$gt": left > right, "$gte": left >= right, "$lt": left < right, "$lte": left <= right}[operator]


def value_matches(value: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics: nested dicts match field by field, `$` operators compare,
    lists match element by element, anything else by equality."""
    if isinstance(wanted, dict):
        if any(str(k).startswith("$") for k in wanted):
            return all(_operator(value, op, operand) for op, operand in wanted.items())
        return isinstance(value, dict) and all(value_matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(value, list)
            and len(value) == len(wanted)
            and all(value_matches(a, b) for a, b in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)


def _ranked(items: list[StoreItem], query: str, *, tenant_id: int) -> list[tuple[float | None, StoreItem]]:
    try:
        _, vector = embed_query(query)
    except EmbedderError:
        return [(None, item) for item in items]
    texts = sorted({text for item in items for text in item.texts})
    scores = dict(zip(texts, cosines_cached(vector, texts, tenant_id=tenant_id), strict=True))
    scored: list[tuple[float, StoreItem]] = []
    unscored: list[tuple[float | None, StoreItem]] = []
    for item in items:
        known = [s for text in item.texts if (s := scores.get(text)) is not None]
        if known:
            scored.append((max(known), item))
        else:
            unscored.append((None, item))
    scored.sort(key=lambda pair: pair[0], reverse=True)
    return [*scored, *unscored]


def store_search(*, scope: StoreScope, search: Search) -> list[tuple[float | None, StoreItem]]:
    """Items under the prefix that match the filter: ranked by meaning when there is a query,
    else in the order they were first written; `offset`/`limit` applied last."""
    rows = _live(scope)
    if search.namespace_prefix:
        path = _path(search.namespace_prefix)
        rows = rows.filter(Q(namespace_path=path) | Q(namespace_path__startswith=path + NAMESPACE_JOIN))
    items = [
        item
        for item in rows.order_by("pk")
        if not search.filter or all(value_matches(item.value.get(k), v) for k, v in search.filter.items())
    ]
    ranked: list[tuple[float | None, StoreItem]] = (
        _ranked(items, search.query, tenant_id=scope.tenant.pk)
        if search.query
        else [(None, item) for item in items]
    )
    page = ranked[search.offset : search.offset + search.limit]
    if search.refresh_ttl:
        _refresh([item for _, item in page])
    return page


def _matches(namespace: tuple[str, ...], path: tuple[str, ...], *, suffix: bool) -> bool:
    if len(namespace) < len(path):
        return False
    pairs = (
        zip(reversed(namespace), reversed(path), strict=False)
        if suffix
        else zip(namespace, path, strict=False)
    )
    return all(wanted == "*" or label == wanted for label, wanted in pairs)


def store_namespaces(*, scope: StoreScope, listing: ListNamespaces) -> list[tuple[str, ...]]:
    """The distinct namespaces holding live items, matching prefix and suffix (`*` any label),
    cut to `max_depth` labels, sorted; `offset`/`limit` applied last."""
    found = {tuple(ns) for ns in _live(scope).values_list("namespace", flat=True).distinct()}
    if listing.prefix:
        found = {ns for ns in found if _matches(ns, listing.prefix, suffix=False)}
    if listing.suffix:
        found = {ns for ns in found if _matches(ns, listing.suffix, suffix=True)}
    if listing.max_depth is not None:
        found = {ns[: listing.max_depth] for ns in found}
    return sorted(found)[listing.offset : listing.offset + listing.limit]


Op = tuple[str, Any]  # ("get", (namespace, key, refresh)) | ("put", Put) | ("search", Search) | ("list", …)


def store_batch(*, scope: StoreScope, ops: list[Op]) -> list[Any]:
    """Carry out a batch in one transaction, as LangGraph's stores do: the reads see the store as
    it was before the batch, then the puts are applied, the last put of a (namespace, key) winning.
    One result per operation, in order (None for a put)."""
    results: list[Any] = []
    puts: dict[tuple[tuple[str, ...], str], Put] = {}
    with transaction.atomic():
        for kind, op in ops:
            if kind == "get":
                namespace, key, refresh = op
                results.append(store_get(scope=scope, namespace=namespace, key=key, refresh_ttl=refresh))
            elif kind == "put":
                namespace_check(op.namespace)
                puts.pop((op.namespace, op.key), None)
                puts[(op.namespace, op.key)] = op
                results.append(None)
            elif kind == "search":
                results.append(store_search(scope=scope, search=op))
            else:
                results.append(store_namespaces(scope=scope, listing=op))
        for put in puts.values():
            store_put(scope=scope, put=put)
        if puts:
            store_expired_purge(scope=scope)
    return results


def store_expired_purge(*, scope: StoreScope, limit: int = 1000) -> int:
    """Delete up to `limit` of the owner's items past their TTL (run by each batch that writes,
    so a store in use does not keep what it can no longer answer); how many went."""
    doomed = StoreItem.objects.filter(tenant=scope.tenant, owner=scope.owner, expires_at__lte=timezone.now())
    pks = list(doomed.values_list("pk", flat=True)[:limit])
    deleted, _ = StoreItem.objects.filter(pk__in=pks).delete()
    return deleted
