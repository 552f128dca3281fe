"""Distillation of finished tasks into experiences.

CONTRACT (called by sessions.task_update when a task becomes succeeded or failed, inside its
transaction; keep this signature). Placeholder body until the experience-memory capability lands.
"""

from __future__ import annotations

from typing import Any


def task_finished(*, tenant: Any, task: Any) -> None:
    """React to a finished task (light path record and event, or queue full distillation)."""
    return None
