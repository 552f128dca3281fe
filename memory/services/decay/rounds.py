"""Rounds: a round is a user turn; the session's counter lives in FactRoundCounter."""

from __future__ import annotations

from django.db import connection

from memory.models import FactRoundCounter, Message, MessageRole, Session, Tenant, TrackedFact


def rounds_advance(
    *, tenant: Tenant, session: Session, user_messages: int, last_user_seq: int
) -> tuple[int, bool]:
    """Add `user_messages` rounds to the session's counter; return the new total and whether the
    session tracks any fact (one round trip: the append hot path).

    Runs under the session row lock messages_append holds, so counters never race. The first
    call counts the session's user messages (the new ones included: they are already inserted).
    """
    table, facts = FactRoundCounter._meta.db_table, TrackedFact._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET rounds = rounds + %s, last_user_seq = %s WHERE session_id = %s "
            f"RETURNING rounds, EXISTS (SELECT 1 FROM {facts} WHERE session_id = %s)",
            [user_messages, last_user_seq, session.pk, session.pk],
        )
        row = cursor.fetchone()
    if row is not None:
        return int(row[0]), bool(row[1])
    total = Message.objects.filter(session=session, role=MessageRole.USER).count()
    FactRoundCounter.objects.create(tenant=tenant, session=session, rounds=total, last_user_seq=last_user_seq)
    return total, TrackedFact.objects.filter(session=session).exists()


def round_and_facts(*, session: Session) -> tuple[int, bool]:
    """The session's current round and whether it tracks any fact, in one round trip. Read-only."""
    table, facts = FactRoundCounter._meta.db_table, TrackedFact._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (SELECT rounds FROM {table} WHERE session_id = %s), "
            f"EXISTS (SELECT 1 FROM {facts} WHERE session_id = %s)",
            [session.pk, session.pk],
        )
        rounds, has_facts = cursor.fetchone()
    if rounds is None:
        rounds = Message.objects.filter(session=session, role=MessageRole.USER).count()
    return int(rounds), bool(has_facts)


def session_round(*, session: Session) -> int:
    """The session's current round (its number of user turns). Read-only."""
    rounds = FactRoundCounter.objects.filter(session=session).values_list("rounds", flat=True).first()
    if rounds is not None:
        return int(rounds)
    return Message.objects.filter(session=session, role=MessageRole.USER).count()
