import json
import os
from pathlib import Path
from typing import Any

import pytest

from ctxapp.cli import main
from memory.services.tenancy import api_key_create

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_run(live_server: Any, celery_worker: Any, tenant_a: Any, capsys: Any) -> None:
    secret = api_key_create(tenant=tenant_a, name="eval")[1]
    path = os.environ["EVAL_FILE"]
    code = main(["eval", "recall", path, "--url", live_server.url, "--api-key", secret, "--json", "--baseline", *os.environ.get("EVAL_EXTRA", "").split()])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    Path(os.environ["EVAL_OUT"]).write_text(out)
    assert code == 0
