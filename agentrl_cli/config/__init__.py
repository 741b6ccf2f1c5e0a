"""Typed platform configuration: models (`models.py`), loading and merging (`load.py`), and
error messages that name the key path, the value, the rule and the fix (`explain.py`)."""

from agentrl_cli.config.load import DEFAULT_CONFIG_NAME, LoadedConfig, config_hash, load_config
from agentrl_cli.config.models import HarnessConfig, PlatformConfig

__all__ = ["DEFAULT_CONFIG_NAME", "HarnessConfig", "LoadedConfig", "PlatformConfig", "config_hash", "load_config"]
