"""Events are written by the recorder (memory/services/recorder.py) alone, so the event row, its
OTel fields and its live-update summary have one definition. This scans the application source
for the ways a module could write an event row itself: an ORM create/bulk_create on Event, or
raw SQL that inserts into the event table (by its name or through Event._meta.db_table)."""

import re
from pathlib import Path

from memory.models import Event

ROOT = Path(__file__).resolve().parents[2]
RECORDER = Path("memory/services/recorder.py")

ORM_WRITE = re.compile(r"\bEvent\.objects\.(?:create|bulk_create|get_or_create|update_or_create)\b")
SQL_INSERT = re.compile(r"INSERT\s+INTO\s+(\S+)", re.IGNORECASE)


def _sources() -> list[Path]:
    files: list[Path] = []
    for package in ("memory", "ctxapp", "dashboard"):
        files += [p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts]
    return files


def _writes_events(text: str) -> list[str]:
    found = ORM_WRITE.findall(text)
    names_event_table = Event._meta.db_table in text or "Event._meta.db_table" in text
    for target in SQL_INSERT.findall(text):
        # By the table's name, or by a placeholder (`{event}`, `{table}`, `{Event._meta.db_table}`)
        # in a module that names it.
        by_name = target.strip("\"'`{}(") == Event._meta.db_table
        by_placeholder = names_event_table and re.fullmatch(r"\{[\w.]*(event|table)[\w.]*\}", target, re.I)
        if by_name or by_placeholder:
            found.append(f"INSERT INTO {target}")
    return found


def test_only_the_recorder_inserts_events() -> None:
    offenders = {}
    for path in _sources():
        relative = path.relative_to(ROOT)
        if relative == RECORDER:
            continue
        writes = _writes_events(path.read_text())
        if writes:
            offenders[str(relative)] = writes
    assert offenders == {}, f"event rows written outside the recorder: {offenders}"


def test_the_scan_sees_the_recorders_writes() -> None:
    # The scan must be able to fail: it finds the writes that do exist.
    assert _writes_events((ROOT / RECORDER).read_text())
    assert _writes_events("Event.objects.bulk_create(rows)")
    assert _writes_events('f"INSERT INTO {Event._meta.db_table} (seq) SELECT 1"')
    assert _writes_events(f"cursor.execute('INSERT INTO {Event._meta.db_table} (seq) VALUES (1)')")
