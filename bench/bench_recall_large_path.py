"""Turn recall of the LoCoMo dev set through the large-scope search path (~20 s).

    python bench/bench_recall_large_path.py [--seeds N]

A scope of over 20,000 messages (corpus.SCOPE_CORPUS_MAX) is searched by PostgreSQL alone: word
statistics from the GIN index or the tenant's snapshot, a bounded pool (HNSW + full text,
candidates.py), approximate BM25. The dev conversations are far smaller, so `ctxapp eval recall`
never takes that path. Here every conversation is imported into its own user scope (one session
per conversation session, speakers as names, session dates as `occurred_at`), embedded by the
real model, and each question is asked twice: through the path a scope of its size takes (the
cached corpus, exact) and with SCOPE_CORPUS_MAX = 0 (the large-scope path). Guards changes to the
large-scope path with the only ground truth we have.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_memory import DATA
from bench_retrieval_quality import setup_django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--seeds", type=int, help="candidates.LARGE_POOL_SEEDS for this run")
    args = parser.parse_args()
    setup_django()

    from ctxapp.cli.evaluation_data import load
    from memory.models import Message, Tenant
    from memory.services import message_indexing
    from memory.services.memory_search import SearchScope, candidates, corpus, memory_search
    from memory.services.messages import MessageInput, messages_append
    from memory.services.sessions import session_create

    if args.seeds:
        candidates.LARGE_POOL_SEEDS = args.seeds
    conversations = load(args.data)  # the harness's own reading of a LoCoMo-format file
    tenant = Tenant.objects.create(name="dev", slug="dev")
    for number, conversation in enumerate(conversations):
        for _, occurred_at, turns in conversation.sessions:
            session = session_create(tenant=tenant, agent_external_id="bot", user_id=f"c{number}")
            items = [
                MessageInput(
                    role="user",
                    content=turn["text"],
                    name=turn["speaker"],
                    occurred_at=occurred_at,
                    metadata={"dia_id": turn["dia_id"]},
                )
                for turn in turns
            ]
            messages_append(tenant=tenant, items=items, session=session)
    while Message.objects.filter(tenant=tenant, embedding__isnull=True).exists():
        message_indexing.memory_index_drain(time_budget=60)
    dia_ids = {
        (message.session.public_id, message.seq): message.metadata.get("dia_id")
        for message in Message.objects.filter(tenant=tenant).select_related("session")
    }

    def recall() -> tuple[float, float]:
        at5, at10 = [], []
        for number, conversation in enumerate(conversations):
            for qa in conversation.questions:
                evidence = set(qa.get("evidence", []))
                if not evidence:
                    continue
                hits = memory_search(
                    tenant=tenant, query=qa["question"], scope=SearchScope(user_id=f"c{number}"),
                    kinds=["message"], limit=10,
                ).results  # fmt: skip
                found = [dia_ids.get((hit.session, hit.seq)) for hit in hits]
                at5.append(len(evidence & set(found[:5])) / len(evidence))
                at10.append(len(evidence & set(found)) / len(evidence))
        return 100 * statistics.mean(at5), 100 * statistics.mean(at10)

    exact = recall()
    corpus.SCOPE_CORPUS_MAX = 0  # every scope counts as large
    corpus._large_scopes.clear()
    large = recall()
    questions = sum(len(conversation.questions) for conversation in conversations)
    print(f"{len(dia_ids)} turns, {questions} questions, one user scope per conversation")
    print(f"cached corpus (exact)     R@5 {exact[0]:.1f}  R@10 {exact[1]:.1f}")
    print(
        f"large-scope path          R@5 {large[0]:.1f}  R@10 {large[1]:.1f}  "
        f"(LARGE_POOL_SEEDS {candidates.LARGE_POOL_SEEDS})"
    )


if __name__ == "__main__":
    main()
