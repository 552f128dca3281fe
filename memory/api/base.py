"""The base of every /api/v1 view: tenant, validation, idempotent writes, cursor pages.

Views are adapters: validate with a nested InputSerializer, call one service, shape the output.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, ClassVar

from django.conf import settings
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import inline_serializer
from rest_framework import exceptions as drf_exceptions
from rest_framework import serializers
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from memory.api import throttles
from memory.api.strict_strings import string_type_errors
from memory.exceptions import IdempotencyConflict, IdempotencyInProgress, InvalidInput
from memory.models import Agent, IdempotencyRecord, Session, Tenant
from memory.selectors.sessions import session_by_key
from memory.services.agent_access import names_check

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_IDEMPOTENCY_KEY_LENGTH = 255
MAX_BIGINT = 2**63 - 1  # PostgreSQL bigint: the bound of every integer input stored or compared as one
# The longest id the API is given in a body, as its column holds it: a longer one names nothing.
ID_MAX_LENGTH = Agent._meta.get_field("external_id").max_length  # an agent's id, a user's
SESSION_ID_MAX_LENGTH = Session._meta.get_field("public_id").max_length
CURSOR_MAX_LENGTH = 64  # an encoded primary key (encode_cursor) is far shorter
# In a session route, the session id `by-key` means "the session of the `agent` and `key` query
# parameters": the application's own id of the conversation instead of ours.
SESSION_BY_KEY = "by-key"
FREE_JSON_FIELDS = (serializers.DictField, serializers.JSONField)  # lists are checked item by item


def json_size_error(value: Any) -> str | None:
    """Why a free JSON value is too large (CTXAPP_MAX_JSON_FIELD_BYTES, as compact UTF-8 JSON), or None."""
    limit = settings.CTXAPP.max_json_field_bytes
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())
    if size <= limit:
        return None
    return f"Is {size} bytes as JSON; at most {limit} (CTXAPP_MAX_JSON_FIELD_BYTES)."


# The base of every request-body serializer: what the body holds is what the API declares. A field
# the serializer does not declare is refused (422 `validation_error` naming it, with the known
# ones), so a typo is never silently dropped; so is a free JSON value (a dict or JSON field; a
# list's items are checked by their own field) over CTXAPP_MAX_JSON_FIELD_BYTES as compact JSON,
# checked before the field itself is validated; and so is a number sent for a string (DRF's
# CharField turns 123 into "123": here every string field, a list's or a dict's string items
# included, takes a JSON string only).
# Nested input serializers are checked the same way. (A comment, not a docstring: drf-spectacular
# would make a docstring the description of every request component.)
class JsonBooleanField(serializers.BooleanField):
    """A JSON `true` or `false` as sent: "yes", 1 or "on" are refused, not read as true."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            raise serializers.ValidationError("Must be a boolean (true or false).")
        return data


class BodySerializer(serializers.Serializer):
    #: Free JSON fields that are documents, not annotations (a state, a prompt's messages): bounded by
    #: a limit of their own or only by the body's (CTXAPP_MAX_BODY_BYTES).
    json_unbounded_fields: ClassVar[frozenset[str]] = frozenset()

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return super().to_internal_value(data)
        known = ", ".join(sorted(self.fields)) or "none"
        errors: dict[str, Any] = {
            name: [f"Unknown field. Known: {known}."] for name in sorted(set(data) - set(self.fields))
        }
        errors.update(self.json_size_errors(data))
        errors.update(string_type_errors(self.fields, data))
        if not errors:
            return super().to_internal_value(data)
        try:
            super().to_internal_value({k: v for k, v in data.items() if k not in errors})
        except serializers.ValidationError as exc:
            if isinstance(exc.detail, dict):
                errors.update({k: v for k, v in exc.detail.items() if k not in errors})
        raise serializers.ValidationError(errors)

    def json_size_errors(self, data: Mapping[str, Any]) -> dict[str, list[str]]:
        errors = {}
        for name, field in self.fields.items():
            if name not in data or name in self.json_unbounded_fields or field.read_only:
                continue
            if not isinstance(field, FREE_JSON_FIELDS):
                continue
            error = json_size_error(data[name])
            if error is not None:
                errors[name] = [error]
        return errors


Handler = Callable[..., Response]
HANDLER_NAMES = ("get", "post", "put", "patch", "delete")


def api_handler(method: Handler) -> Handler:
    """What every handler of a TenantApiView gets around it (the class applies it to each, once):

    - a session addressed as `by-key` in the path is resolved to its public id first;
    - a write carrying an `Idempotency-Key` header runs at most once (TenantApiView.idempotent).
    """
    if getattr(method, "api_handler", False):
        return method

    @functools.wraps(method)
    def handle(view: TenantApiView, request: Request, *args: Any, **kwargs: Any) -> Response:
        if kwargs.get("session_id") == SESSION_BY_KEY:
            kwargs["session_id"] = view.session_by_key(request)
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is None or request.method not in WRITE_METHODS:
            return method(view, request, *args, **kwargs)
        return view.idempotent(request, key, lambda: method(view, request, *args, **kwargs))

    handle.api_handler = True  # type: ignore[attr-defined]
    return handle


class TenantApiView(APIView):
    """An API view whose caller is one tenant (from its API key).

    Any write carrying an `Idempotency-Key` header runs at most once: the response is stored in
    the same transaction as the write, and a retry with the same key and body gets it back
    (header `Idempotent-Replayed: true`); the same key with another body → 409. Every handler a
    subclass defines is wrapped in `api_handler` when the class is made, so no write can miss it.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in HANDLER_NAMES:
            if name in cls.__dict__:
                setattr(cls, name, api_handler(cls.__dict__[name]))

    required_scope: str | None = None
    #: A key bound to an agent may only name that agent, and only touch that agent's sessions and
    #: tasks: path ids (`agent`, `session_id`, `task_id`) and the `agent` / `session` / `task` query
    #: parameters and body fields are checked before the handler runs (403 `agent_mismatch`).
    #: False only where the objects are shared between agents by design and the view acts as the
    #: calling agent instead (the task layers: shared context, private context, messages).
    agent_binding: bool = True
    BINDING_PATH_KWARGS = {"agent": "agent", "session_id": "session", "task_id": "task"}
    BINDING_FIELDS: tuple[str, ...] = ("agent", "session", "task")
    # Idempotency-Key handling. Optimistic (hot paths whose write is cheap and wholly inside the
    # transaction: appends, checkpoints, state writes): one statement, the write runs and a
    # duplicate rolls its run back. Otherwise the key is reserved first (two statements), so a
    # retry of a costly write (a context build, a summary) replays without running it again.
    idempotent_optimistic: bool = False

    @property
    def tenant(self) -> Tenant:
        return self.request.auth.tenant  # type: ignore[union-attr]

    def validate(self, serializer_class: type[serializers.Serializer], data: Any = None) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.data if data is None else data)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)

    def validate_query(self, serializer_class: type[serializers.Serializer]) -> dict[str, Any]:
        return self.validate(serializer_class, data=self.request.query_params)

    # --- agent-bound keys -------------------------------------------------------------------
    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # An address guessing keys: 429 before any key lookup in the database. Checked then, or in
        # the rate-limit statement (no round trip of its own), or before an error answer.
        throttles.auth_failures_defer(request)
        super().initial(request, *args, **kwargs)
        bound = getattr(request.auth, "agent_external_id", "")
        if bound and self.agent_binding:
            self.agent_binding_check(request, bound, kwargs)

    def session_by_key(self, request: Request) -> str:
        """The public id of the session the `agent` and `key` query parameters name.

        Asked after the agent-binding check (a bound key naming another agent answers 403, as
        with an id); an unknown pair answers 404.
        """
        agent, key = request.query_params.get("agent"), request.query_params.get("key")
        missing = [name for name, value in (("agent", agent), ("key", key)) if not value]
        if missing:
            raise InvalidInput(
                f"A session addressed as `{SESSION_BY_KEY}` needs the `agent` and `key` query parameters.",
                details={"fields": {name: ["Required with session id `by-key`."] for name in missing}},
            )
        assert agent is not None and key is not None
        return session_by_key(tenant=self.tenant, agent_external_id=agent, key=key).public_id

    def check_throttles(self, request: Request) -> None:
        """DRF's check, with every rate limit of the request counted in one round trip."""
        exceeded = throttles.throttles_exceeded(request, self, self.get_throttles())
        if exceeded:
            waits = [w for t in exceeded if (w := t.wait()) is not None]
            # As DRF: the longest wait, or None (no Retry-After) when no throttle knows one.
            self.throttled(request, max(waits) if waits else None)  # type: ignore[arg-type]

    def agent_binding_check(self, request: Request, bound: str, kwargs: dict[str, Any]) -> None:
        named: dict[str, list[str]] = {"agent": [], "session": [], "task": []}
        for kwarg, kind in self.BINDING_PATH_KWARGS.items():
            if isinstance(kwargs.get(kwarg), str):
                named[kind].append(kwargs[kwarg])
        for field in self.BINDING_FIELDS:
            named[field].extend(request.query_params.getlist(field))
        if request.method in WRITE_METHODS and request.content_type.startswith("application/json"):
            request._request.body  # noqa: B018 - cache the raw body first: the idempotency check reads it
            data = request.data
            if isinstance(data, dict):
                named.update(
                    {f: [*named[f], data[f]] for f in self.BINDING_FIELDS if isinstance(data.get(f), str)}
                )
        names_check(
            tenant=self.tenant,
            bound_agent=bound,
            agents=named["agent"],
            session_ids=named["session"],
            task_ids=named["task"],
        )

    def handle_exception(self, exc: Exception) -> Response:
        if not isinstance(exc, drf_exceptions.Throttled):
            try:  # the put-off failed-authentication check, if it has not run: its 429 comes first
                throttles.auth_failures_settle(self.request)
            except drf_exceptions.Throttled as throttled:
                exc = throttled
        if isinstance(exc, drf_exceptions.NotAuthenticated | drf_exceptions.AuthenticationFailed):
            throttles.auth_failure_record(self.request)
        return super().handle_exception(exc)

    # --- idempotency -----------------------------------------------------------------------
    def idempotent(self, request: Request, key: str, run: Callable[[], Response]) -> Response:
        """`run` the write at most once for `key` (see the class docstring)."""
        if not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH:
            raise InvalidInput(
                f"The {IDEMPOTENCY_HEADER} header must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} characters.",
                details={"header": IDEMPOTENCY_HEADER},
            )
        body = request._request.body  # read once, before the parser; Django keeps a copy for it
        digest = hashlib.sha256(
            b"\0".join([(request.method or "").encode(), request.get_full_path().encode(), body])
        ).hexdigest()
        tenant = self.tenant
        now = timezone.now()
        ttl = timedelta(hours=settings.CTXAPP.idempotency_ttl_hours)
        if not self.idempotent_optimistic:
            return self._idempotent_reserved(key, digest, now, ttl, run)
        # Optimistic, one statement per write: run the write, then store its response under the
        # key in the same transaction. A second request with the key (a retry, or a duplicate
        # running concurrently) finds the key taken when it tries to store its own response (the
        # unique index makes it wait for the first to commit or roll back), rolls its whole write
        # back, and answers with the stored response. So the write still commits at most once.
        # A key past its TTL (not yet purged by retention) is taken over by the same statement.
        try:
            with transaction.atomic():
                response = run()
                if response.status_code >= 500:
                    transaction.set_rollback(True)
                    return response
                if self._idempotency_store(tenant, key, digest, now, now - ttl, response):
                    return response
                transaction.set_rollback(True)  # the key is taken: undo this run of the write
        except Exception:
            # A retry of a write that succeeded may now fail (its session has ended since):
            # the stored response answers it. Without one, the error stands.
            stored = IdempotencyRecord.objects.filter(
                tenant=tenant, key=key, created_at__gte=now - ttl
            ).first()
            if stored is None:
                raise
            return self._idempotency_replay(stored, digest)
        stored = IdempotencyRecord.objects.get(tenant=tenant, key=key)
        return self._idempotency_replay(stored, digest)

    def _idempotent_reserved(
        self, key: str, digest: str, now: Any, ttl: timedelta, run: Callable[[], Response]
    ) -> Response:
        tenant = self.tenant
        with transaction.atomic():
            # If another request holds this key in an open transaction, this INSERT waits for it
            # to commit or roll back (unique index), so we never run the write twice.
            with connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {IdempotencyRecord._meta.db_table} "
                    "(tenant_id, key, request_hash, created_at) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (tenant_id, key) DO NOTHING RETURNING id",
                    [tenant.pk, key, digest, now],
                )
                row = cursor.fetchone()
            if row is None:
                record = IdempotencyRecord.objects.select_for_update().get(tenant=tenant, key=key)
                if record.created_at >= now - ttl:
                    return self._idempotency_replay(record, digest)
                # Past its TTL (not yet purged by retention): the key is free to reuse.
                record.request_hash, record.created_at = digest, now
                record.status_code = record.response_body = None
                record.save(update_fields=["request_hash", "created_at", "status_code", "response_body"])
                row = (record.pk,)
            response = run()
            if response.status_code >= 500:
                transaction.set_rollback(True)
                return response
            IdempotencyRecord.objects.filter(pk=row[0]).update(
                status_code=response.status_code, response_body=response.data
            )
            return response

    @staticmethod
    def _idempotency_store(
        tenant: Tenant, key: str, digest: str, now: Any, expired_before: Any, response: Response
    ) -> bool:
        """Store the response under the key (or take over an expired one); False if the key is taken."""
        table = IdempotencyRecord._meta.db_table
        body = IdempotencyRecord._meta.get_field("response_body").get_db_prep_save(response.data, connection)
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} AS r "
                "(tenant_id, key, request_hash, status_code, response_body, created_at) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (tenant_id, key) DO UPDATE SET "
                "request_hash = EXCLUDED.request_hash, status_code = EXCLUDED.status_code, "
                "response_body = EXCLUDED.response_body, created_at = EXCLUDED.created_at "
                "WHERE r.created_at < %s RETURNING r.id",
                [tenant.pk, key, digest, response.status_code, body, now, expired_before],
            )
            return cursor.fetchone() is not None

    @staticmethod
    def _idempotency_replay(stored: IdempotencyRecord, digest: str) -> Response:
        if stored.request_hash != digest:
            raise IdempotencyConflict(details={"header": IDEMPOTENCY_HEADER})
        if stored.status_code is None:  # reserved by a write still running (or rolled back since)
            raise IdempotencyInProgress()
        response = Response(stored.response_body, status=stored.status_code)
        response["Idempotent-Replayed"] = "true"
        return response


# --- cursor pages ---------------------------------------------------------------------------


class CursorSerializer(serializers.Serializer):
    cursor = serializers.CharField(required=False, allow_blank=True, max_length=CURSOR_MAX_LENGTH)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000)


def encode_cursor(value: int) -> str:
    return base64.urlsafe_b64encode(str(value).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return int(base64.urlsafe_b64decode(padded.encode()).decode())
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidInput(
            "The cursor is not valid: pass back the next_cursor of a previous page.",
            details={"fields": {"cursor": ["Not a valid cursor."]}},
        ) from None


def keyset_page(
    queryset: QuerySet[Any], *, cursor: str | None, limit: int | None, newest_first: bool = True
) -> tuple[list[Any], str | None]:
    """One page of `queryset` ordered by primary key, and the cursor of the next page (or None)."""
    size = limit or settings.CTXAPP.page_size
    if cursor:
        last = decode_cursor(cursor)
        queryset = queryset.filter(pk__lt=last) if newest_first else queryset.filter(pk__gt=last)
    rows = list(queryset.order_by("-pk" if newest_first else "pk")[: size + 1])
    next_cursor = encode_cursor(rows[size - 1].pk) if len(rows) > size else None
    return rows[:size], next_cursor


# --- the one list envelope ------------------------------------------------------------------
# Every list answers {"items": [...], "next": <where the next page starts> | null}. The older names
# of `next` stay as deprecated aliases with the same value (`next_cursor` for pk-keyset lists,
# `next_after` for seq lists), so clients written against them keep working.


class KeysetPagination(BasePagination):
    """Newest first, keyset on the primary key; `next` is an opaque cursor (pass as `cursor`)."""

    alias = "next_cursor"
    newest_first = True
    next: str | None = None

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> list[Any]:
        params = CursorSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        rows, self.next = keyset_page(
            queryset,
            cursor=params.validated_data.get("cursor"),
            limit=params.validated_data.get("limit"),
            newest_first=self.newest_first,
        )
        return rows

    def get_paginated_response(self, data: Any) -> Response:
        return Response({"items": data, "next": self.next, self.alias: self.next})


class SeqPagination(BasePagination):
    """Oldest first by seq; `next` is the seq to pass as `after` for the next page."""

    alias = "next_after"
    next: int | None = None

    def paginate_rows(self, rows: list[Any], limit: int) -> list[Any]:
        """`rows` were fetched with limit + 1 (seq > after, ascending): trim and note where to go on."""
        self.next = rows[limit - 1].seq if len(rows) > limit else None
        return rows[:limit]

    def get_paginated_response(self, data: Any) -> Response:
        return Response({"items": data, "next": self.next, self.alias: self.next})


def keyset_response(view: APIView, queryset: Any, serializer: type[serializers.Serializer]) -> Response:
    """One page of `queryset`, newest first, in the list envelope {items, next}."""
    pages = KeysetPagination()
    rows = pages.paginate_queryset(queryset, view.request, view)
    return pages.get_paginated_response(serializer(rows, many=True).data)


def page_serializer(name: str, item: serializers.Serializer, pagination: type[BasePagination]) -> Any:
    """The OpenAPI component of one list envelope (`items`, `next` and its deprecated alias)."""
    if pagination is SeqPagination:
        next_field: serializers.Field = serializers.IntegerField(
            allow_null=True, help_text="Pass as `after` for the next page; null on the last page."
        )
        alias: serializers.Field = serializers.IntegerField(allow_null=True, help_text="Deprecated: `next`.")
    else:
        next_field = serializers.CharField(
            allow_null=True, help_text="Pass as `cursor` for the next page; null on the last page."
        )
        alias = serializers.CharField(allow_null=True, help_text="Deprecated: `next`.")
    return inline_serializer(name, {"items": item, "next": next_field, pagination.alias: alias})  # type: ignore[attr-defined]
