"""SGLang gets inference.api_key from a file only this user reads (`--config`), never on argv."""

import stat

import yaml

from agentrl_cli.config.load import load_config
from agentrl_cli.engines.sglang import sglang_command


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_the_key_travels_in_a_private_config_file_not_on_the_command_line(tmp_path):
    key = "sk-test-7f3a9c1d2e4b"
    cfg = load_config(None, [f"inference.api_key={key}", "inference.engine=sglang"], env={}).config
    cmd = sglang_command(cfg.inference, "/models/m", 30001, None, tmp_path / "keys")
    assert not any(key in part for part in cmd) and "--api-key" not in cmd
    path = tmp_path / "keys" / "sglang-30001.yaml"
    assert _flag(cmd, "--config") == str(path)
    assert yaml.safe_load(path.read_text()) == {"api-key": key}  # SGLang's --config takes its flags' long names
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700


def test_without_a_key_there_is_no_config_file(tmp_path):
    cfg = load_config(None, ["inference.engine=sglang"], env={}).config
    cmd = sglang_command(cfg.inference, "/models/m", 30001, None, tmp_path / "keys")
    assert "--config" not in cmd and not (tmp_path / "keys").exists()
