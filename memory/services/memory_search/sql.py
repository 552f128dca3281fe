"""The SQL every message query of one search shares: the scope's WHERE clause and a raw fetch."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections

from memory.models import Tenant
from memory.replica import REPLICA, read_alias, replica_failed
from memory.services import ranking
from memory.services.embedding import EMBEDDING_DIMENSIONS


@dataclass
class MessageCandidate(ranking.Candidate):
    content: str = ""


_VECTOR_LITERAL = "[" + ",".join(["%.7g"] * EMBEDDING_DIMENSIONS) + "]"


def vector_literal(vector: np.ndarray) -> str:
    """pgvector's text form of the query's vector (7 significant digits), formatted in one step."""
    if vector.shape == (EMBEDDING_DIMENSIONS,):
        return _VECTOR_LITERAL % tuple(vector.tolist())
    return "[" + ",".join(f"{x:.7g}" for x in vector.tolist()) + "]"


def terms_or_query(query: str) -> str:
    """The query's words OR-ed for to_tsquery, which normalises (stems) each as the configuration
    does its index (words are [a-z0-9]+, so nothing to escape)."""
    return " | ".join(dict.fromkeys(ranking.words(query)))


class ScopeWhere:
    """The WHERE clause shared by every message query of one search: the scope (the tenant, its
    sessions) and the time range, over the messages aliased `m` (`clause` for another alias)."""

    def __init__(
        self,
        *,
        tenant: Tenant,
        session_pks: list[int] | None,
        time_from: datetime | None,
        time_to: datetime | None,
    ) -> None:
        clauses = ["m.tenant_id = %s"]
        params: list[Any] = [tenant.pk]
        if session_pks is not None:
            clauses.append("m.session_id = ANY(%s)")
            params.append(session_pks)
        if time_from is not None:
            clauses.append("m.occurred_at >= %s")
            params.append(time_from)
        if time_to is not None:
            clauses.append("m.occurred_at <= %s")
            params.append(time_to)
        self.where = " AND ".join(clauses)
        self.params = params
        self.tenant_id: int = tenant.pk

    def clause(self, alias: str) -> str:
        return self.where.replace("m.", f"{alias}.")


def fetch_rows(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    # A replica may answer (memory/replica.py); one that fails is marked down and the primary answers.
    alias = read_alias()
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())
    except (OperationalError, InterfaceError) as exc:
        if alias != REPLICA:
            raise
        replica_failed(exc)
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())
