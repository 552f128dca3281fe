"""The jobs page reads the job records: every kind's outcome, and the running ones without Redis."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.test import Client
from django.utils import timezone

from memory.models import JobIntent, Tenant
from memory.services import jobs
from memory.services import sessions as sessions_service
from memory.services.session_digest import DIGEST_JOB
from memory.tasks import jobs as job_kinds  # noqa: F401 - registers what each kind runs, as a worker loads it


def test_it_lists_each_jobs_outcome_from_its_record(
    web_alice: Client, web_bob: Client, tenant_a: Tenant, session_a: Any
) -> None:
    sessions_service.session_end(tenant=tenant_a, session=session_a)  # queues the session's digest
    [digest_job] = JobIntent.objects.filter(kind=DIGEST_JOB)
    assert jobs.job_run(intent_id=digest_job.pk) == "done"  # what a worker runs
    with transaction.atomic():
        broken = jobs.job_enqueue(
            tenant=tenant_a, kind=DIGEST_JOB, key="broken", payload={"session": "not-an-id"}
        )
    assert broken is not None and jobs.job_run(intent_id=broken) == "failed"

    page = web_alice.get("/jobs/").content.decode()
    records = page.split('data-testid="job-records"')[1].split("</table>")[0]
    assert records.count("Write the session&#x27;s digest") == 2 and DIGEST_JOB not in records
    assert ">done<" in records and ">failed<" in records
    assert "not-an-id" in records  # the reason it failed
    assert f"&quot;session&quot;: &quot;{session_a.public_id}&quot;" in records  # the done one's result
    # the job is for the session, named and linked by its public id, not the record's key
    assert (
        f'<a href="/sessions/{session_a.public_id}/">session <code>{session_a.public_id}</code></a>'
        in records
    )
    assert f"session:{session_a.pk}" not in records
    assert "Write the session" not in web_bob.get("/jobs/").content.decode()  # Bob's tenant ran none


def test_the_running_panel_reads_the_job_records(
    web_alice: Client, web_bob: Client, tenant_a: Tenant, session_a: Any
) -> None:
    key = f"session:{session_a.pk}"
    with transaction.atomic():
        intent_id = jobs.job_enqueue(
            tenant=tenant_a, kind=DIGEST_JOB, key=key, payload={"session": session_a.pk}
        )
    # the mark a runner sets when it takes the job (memory/services/jobs.py job_run)
    JobIntent.objects.filter(pk=intent_id).update(status="running", taken_at=timezone.now(), attempts=1)

    panel = web_alice.get("/jobs/running").content.decode()
    running = panel.split('data-testid="running-records"')[1].split("</table>")[0]
    assert "Write the session&#x27;s digest" in running and session_a.public_id in running
    assert key not in panel and DIGEST_JOB not in panel  # words, not record keys and kinds
    assert "Write the session" not in web_bob.get("/jobs/running").content.decode()
