"""The bridge's config: strict as written, every problem named, the example kept honest, the
environment over the file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pydantic import BaseModel

from holdover import settings
from holdover.settings import ConfigError, Settings
from holdover.settings import example as config_example
from support import HOLDOVER

ROOT = Path(__file__).resolve().parents[2]
KEY = "3c9e1f7a5b2d8c4e6f0a1b3d5e7c9a2f"


def _fields(model: type[BaseModel], path: str = "") -> list[tuple[str, type[BaseModel], str]]:
    out = []
    for name, f in model.model_fields.items():
        sub = settings.section_model(f.annotation)
        if sub is None:
            out.append((f"{path}{name}", model, name))
        else:
            out.extend(_fields(sub, f"{path}{name}."))
    return out


def test_the_example_is_the_models_own_and_names_every_field(tmp_path: Path) -> None:
    text = (ROOT / "holdover.toml.example").read_text()
    assert text == config_example.example_toml(), "holdover.toml.example is stale: holdover config-example > it"
    for dotted, model, name in _fields(Settings):
        assert model.model_fields[name].description, f"{dotted} has no description for the example"
        assert f"\n{name} = " in text or f"\n# {name} = " in text or f"# # {name} = " in text, dotted
    key = tmp_path / "rack1.key"
    key.write_text(KEY)
    cfg = settings.parse(settings.tomllib.loads(text.replace("/etc/holdover/rack1.key", str(key))), env=False)
    assert cfg.sentinels[0].id == "rack1" and cfg.keys() == {"rack1": KEY.encode()}
    assert (cfg.mqtt, cfg.protect, cfg.web, cfg.alerts) == (
        settings.MqttSettings(),
        settings.ProtectSettings(),
        settings.WebSettings(),
        settings.AlertSettings(),
    )


def test_the_commented_out_entries_of_the_example_are_valid_when_uncommented() -> None:
    for field in ("serial", "hooks", "alerts.channels", "failover.uplinks"):
        model = Settings
        for part in field.split("."):
            model = settings.section_model(model.model_fields[part].annotation)
        entry = {k.rsplit(".", 1)[1]: v for k, v in config_example.EXAMPLES.items() if k.rsplit(".", 1)[0] == field}
        model.model_validate(entry, strict=True)


def _parse_error(data: dict) -> str:
    with pytest.raises(ConfigError) as e:
        settings.parse(data, "h.toml", env=False)
    return str(e.value)


def test_types_are_strict_as_on_the_board_and_unknown_keys_get_a_suggestion() -> None:
    msg = _parse_error(
        {
            "mqtt": {"port": "1883", "hots": "10.0.0.2"},
            "sentinels": [{"id": "rack1", "key": KEY, "key_fiel": "/x"}],
            "protect": {"enabled": "yes"},
            "failovr": {},
        }
    )
    assert msg.startswith("h.toml: 5 problem(s)"), msg
    assert "mqtt.port: must be a whole number, not the string '1883' (no quotes)" in msg
    assert "mqtt.hots: unknown key; did you mean 'host'?" in msg
    assert "sentinels.0.key_fiel: unknown key; did you mean 'key_file'?" in msg
    assert "protect.enabled: must be true or false, not the string 'yes'" in msg
    assert "failovr: unknown key; did you mean 'failover'?" in msg
    assert "unknown key (known: " in _parse_error({"zzz": 1, "sentinels": []})
    assert "empty; holdover.toml.example has every setting" in _parse_error({})


def test_the_environment_overrides_the_file_and_is_named_when_wrong(monkeypatch) -> None:
    base = {"mqtt": {"host": "10.0.0.2"}, "sentinels": [{"id": "rack1", "key": KEY}]}
    monkeypatch.setenv("HOLDOVER_MQTT__PORT", "1999")
    monkeypatch.setenv("HOLDOVER_WEB__TOKEN", "from-the-environment")
    monkeypatch.setenv("HOLDOVER_PROTECT__SHM", '["nccl-*"]')
    cfg = settings.parse(base)
    assert (cfg.mqtt.host, cfg.mqtt.port, cfg.web.token, cfg.protect.shm) == (
        "10.0.0.2",
        1999,
        "from-the-environment",
        ["nccl-*"],
    )
    monkeypatch.setenv("HOLDOVER_MQTT__PORT", "eighty")
    with pytest.raises(ConfigError, match=r"with HOLDOVER_MQTT__PORT.*\n  mqtt.port: "):
        settings.parse(base, "h.toml")


def test_the_bridge_refuses_a_config_without_sentinels(tmp_path: Path) -> None:
    cfg = tmp_path / "h.toml"
    cfg.write_text('[mqtt]\nhost = "127.0.0.1"\n')
    r = subprocess.run([HOLDOVER, "bridge", "-c", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no [[sentinels]] and no [ups]: the bridge would hear nobody" in r.stderr, r.stderr
    assert "holdover keygen" in r.stderr
