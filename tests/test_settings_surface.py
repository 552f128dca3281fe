"""The one settings surface: strict parsing, `ctxapp config` (sources, masking), docs/settings.md."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from ctxapp.cli import main, settings_markdown
from ctxapp.conf import SETTINGS, CtxappSettings, SettingError, load, resolve_all

REPO = Path(__file__).resolve().parents[1]


def _raw(value: Any) -> str:
    return ",".join(value) if isinstance(value, list) else str(value)


def test_every_setting_has_one_name_a_type_a_default_and_a_line_of_documentation() -> None:
    names = [setting.env for setting in SETTINGS]
    assert len(names) == len(set(names)), "a setting is declared twice"
    for setting in SETTINGS:
        assert setting.env == setting.env.upper() and " " not in setting.env
        assert setting.doc.strip(), f"{setting.env} has no documentation"
        assert setting.type_name
        # The default is a value of the declared type: it survives a round trip through the parser.
        if setting.default not in (None, ""):
            assert setting.parse(_raw(setting.default)) == setting.default, setting.env


@pytest.mark.parametrize(
    ("variable", "raw", "expected"),
    [
        ("CTXAPP_PORT", "http", "CTXAPP_PORT='http' is not a valid port"),
        ("CTXAPP_PORT", "0", "expected a TCP port between 1 and 65535"),
        ("CTXAPP_DEBUG", "sometimes", "CTXAPP_DEBUG='sometimes' is not a valid bool"),
        ("CTXAPP_WEB_WORKERS", "-1", "CTXAPP_WEB_WORKERS='-1' is not a valid positive int"),
        ("CTXAPP_DB_POOL_SIZE", "1.5", "CTXAPP_DB_POOL_SIZE='1.5' is not a valid int"),
        ("CTXAPP_LOG_LEVEL", "verbose", "expected one of debug, info, warning, error"),
    ],
)
def test_a_bad_value_fails_naming_the_variable(variable: str, raw: str, expected: str) -> None:
    with pytest.raises(SettingError) as error:
        resolve_all(environ={variable: raw})
    assert expected in str(error.value)
    assert str(error.value).startswith(f"{variable}=")


def test_values_are_parsed_to_their_types() -> None:
    resolved = resolve_all(
        environ={
            "CTXAPP_PORT": " 9000 ",
            "CTXAPP_DEBUG": "Yes",
            "CTXAPP_ALLOWED_HOSTS": "a.example, b.example,,",
            "CTXAPP_MAX_BODY_BYTES": "1_000_000",
        }
    )
    assert resolved["CTXAPP_PORT"].value == 9000
    assert resolved["CTXAPP_DEBUG"].value is True
    assert resolved["CTXAPP_ALLOWED_HOSTS"].value == ["a.example", "b.example"]
    assert resolved["CTXAPP_MAX_BODY_BYTES"].value == 1_000_000
    assert {resolved[name].source for name in ("CTXAPP_PORT", "CTXAPP_DEBUG")} == {"environment"}


def test_settings_ctxapp_is_typed_with_one_attribute_per_variable() -> None:
    assert isinstance(django_settings.CTXAPP, CtxappSettings)
    assert [field.name for field in dataclasses.fields(CtxappSettings)] == [
        setting.env.removeprefix("CTXAPP_").lower() for setting in SETTINGS
    ]
    loaded = load(
        environ={"CTXAPP_JOB_KEEP_DAYS": "3", "CTXAPP_THROTTLE_KEY_RATE": "off", "REDIS_URL": "redis://r"}
    )
    assert (loaded.job_keep_days, loaded.throttle_key_rate, loaded.redis_url) == (3, None, "redis://r")
    assert loaded.page_size == 100  # the default
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.page_size = 1  # type: ignore[misc]
    assert dataclasses.replace(loaded, page_size=1).page_size == 1  # how a test overrides a value


def test_loading_fails_naming_the_variable() -> None:
    with pytest.raises(SettingError, match=r"^CTXAPP_JOB_KEEP_DAYS='0' is not a valid positive int"):
        load(environ={"CTXAPP_JOB_KEEP_DAYS": "0"})


@pytest.fixture
def configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An env file and an environment that disagree on one value (the environment wins)."""
    env_file = tmp_path / "ctxapp.env"
    env_file.write_text("CTXAPP_PAGE_SIZE=50\nCTXAPP_PORT=7000\n")
    for setting in SETTINGS:
        monkeypatch.delenv(setting.env, raising=False)
    monkeypatch.setenv("CTXAPP_ENV_FILE", str(env_file))
    monkeypatch.setenv("CTXAPP_PORT", "9000")
    monkeypatch.setenv("DATABASE_URL", "postgresql://ctx:s3cr3t-pw@db.internal:5432/ctxapp")
    monkeypatch.setenv("REDIS_URL", "redis://:r3dis-pw@cache:6379/0")
    monkeypatch.setenv("CTXAPP_SECRET_KEY", "django-insecure-abcdefghijklmnopqrstuvwxyz-1234")
    return env_file


def test_config_shows_each_value_and_where_it_came_from(
    configured: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert set(lines) == {setting.env for setting in SETTINGS}
    assert lines["CTXAPP_PORT"].split()[1] == "9000" and lines["CTXAPP_PORT"].endswith("(environment)")
    assert lines["CTXAPP_PAGE_SIZE"].split()[1] == "50"
    assert lines["CTXAPP_PAGE_SIZE"].endswith(f"(file {configured})")
    assert lines["CTXAPP_DEBUG"].split()[1] == "False" and lines["CTXAPP_DEBUG"].endswith("(default)")


def test_config_masks_secrets_and_url_passwords(configured: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    for secret in ("s3cr3t-pw", "r3dis-pw", "django-insecure-abcdefghijklmnopqrstuvwxyz"):
        assert secret not in out
    assert "postgresql://ctx:****@db.internal:5432/ctxapp" in out
    assert "redis://:****@cache:6379/0" in out
    assert main(["config", "--json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert as_json["DATABASE_URL"] == {
        "value": "postgresql://ctx:****@db.internal:5432/ctxapp",
        "source": "environment",
    }
    assert as_json["CTXAPP_SECRET_KEY"]["value"].startswith("****")
    assert "abcdefghijklmnopqrstuvwxyz" not in as_json["CTXAPP_SECRET_KEY"]["value"]


def test_config_refuses_a_bad_value_naming_it(
    configured: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTXAPP_WORKER_CONCURRENCY", "many")
    assert main(["config"]) == 2
    assert "CTXAPP_WORKER_CONCURRENCY='many' is not a valid positive int" in capsys.readouterr().err


def test_docs_settings_md_is_generated_from_the_settings_surface() -> None:
    committed = (REPO / "docs" / "settings.md").read_text()
    assert committed == settings_markdown(), (
        "docs/settings.md is out of date: regenerate it with `ctxapp config --markdown > docs/settings.md`"
    )
    for setting in SETTINGS:
        assert f"`{setting.env}`" in committed
