"""Config and session-request contracts: unknown fields, refused fields, budgets."""

import math

import pytest
from pydantic import ValidationError

from opencode_tui_core.config import AgentConfig, Budgets, ConfigError, ModelSettings, load_config


def test_defaults_match_design():
    cfg = AgentConfig()
    assert cfg.runtime.opencode_version == "1.18.32"
    assert (cfg.budgets.run_s, cfg.budgets.install_s, cfg.budgets.close_s) == (10800, 600, 60)
    assert cfg.model.context_window == 262144
    assert cfg.model.output_cap == 32768
    assert cfg.model.thinking is True
    assert cfg.sandbox.provider == "local"
    assert cfg.sandbox.mode == "owned"
    assert cfg.sandbox.network == "model-only"


def test_output_cap_is_independent_of_context_window():
    m = ModelSettings(output_cap=1024)
    assert m.context_window == 262144


def test_proxy_address_defaults_to_loopback_and_wildcards_need_an_advertised_address():
    assert ModelSettings().proxy_address == "127.0.0.1"
    assert ModelSettings(proxy_host="0.0.0.0", proxy_advertise="10.0.3.7").proxy_address == "10.0.3.7"
    assert ModelSettings(proxy_host="::1").proxy_address == "[::1]"
    with pytest.raises(ValidationError, match=r"set model\.proxy_advertise"):
        ModelSettings(proxy_host="0.0.0.0")
    with pytest.raises(ValidationError, match="not an address a sandbox can reach"):
        ModelSettings(proxy_host="0.0.0.0", proxy_advertise="0.0.0.0")
    for bad in ("http://10.0.0.1", "10.0.0.1:8080", "host/path", ""):
        with pytest.raises(ValidationError, match="host name or an IP address"):
            ModelSettings(proxy_advertise=bad)


@pytest.mark.parametrize("field", ["run_s", "install_s", "close_s"])
@pytest.mark.parametrize("value", [0, -1, math.inf, math.nan])
def test_budgets_must_be_finite_and_positive(field, value):
    with pytest.raises(ValidationError) as err:
        Budgets(**{field: value})
    assert field in str(err.value)


@pytest.mark.parametrize(
    ("field", "phrase"),
    [("env", "environment"), ("command", "custom agent command"), ("extra_args", "CLI arguments")],
)
def test_a_task_asking_for_what_the_engine_refuses_is_told_why(tmp_path, field, phrase):
    """The refusal reasons reach the user through the task file they wrote (issue 25)."""
    from opencode_tui_core.tasks import load_task

    (tmp_path / "task.yaml").write_text(
        f"id: t\nproblem_statement: p\nverify: {{command: 'true'}}\n{field}: x\n"
    )
    with pytest.raises(ConfigError) as err:
        load_task(tmp_path)
    text = str(err.value)
    assert f"field '{field}' is refused" in text and phrase in text and "task.yaml" in text


def test_unknown_config_field_is_named(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("budgets:\n  run_s: 10\n  runn_s: 5\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert "budgets.runn_s" in str(err.value)
    assert "unknown field" in str(err.value)


def test_toml_config_and_overrides(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[model]\noutput_cap = 2048\n[sandbox]\nprovider = "docker"\n')
    cfg = load_config(f, {"sandbox": {"keep_sandbox": True}})
    assert cfg.model.output_cap == 2048
    assert cfg.model.context_window == 262144
    assert cfg.sandbox.provider == "docker"
    assert cfg.sandbox.keep_sandbox is True


def test_borrowed_needs_sandbox_id():
    with pytest.raises(ConfigError, match="sandbox_id"):
        load_config(None, {"sandbox": {"mode": "borrowed"}})


def test_unreadable_and_malformed_config(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("budgets: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
