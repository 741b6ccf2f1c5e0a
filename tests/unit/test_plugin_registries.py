"""The registries `training.backend` and `training.weight_sync` are read through: the config
accepts exactly their names (or a `module:Class` path), an unknown one is refused at load time
with what exists, a path that cannot be imported says why, and the distributed transport takes
its ranks per server from `inference.tp_size` where the engine joins one rank per GPU."""

from __future__ import annotations

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.config.models import BACKEND_NAMES, WEIGHT_SYNC_NAMES
from agentrl_cli.core.errors import ConfigError, NotFoundError
from agentrl_cli.learner.backend import BACKENDS, backend_class
from agentrl_cli.weightsync.distributed import DistributedTransport
from agentrl_cli.weightsync.registry import TRANSPORTS, make_transport


def config(*sets: str):
    return load_config(None, list(sets), env={}).config


def test_the_config_accepts_exactly_the_registered_names():
    assert set(BACKEND_NAMES) == set(BACKENDS) and set(WEIGHT_SYNC_NAMES) == set(TRANSPORTS)


@pytest.mark.parametrize("key", ["training.backend", "training.weight_sync"])
def test_an_unknown_name_is_refused_at_load_time_naming_the_choices(key):
    with pytest.raises(ConfigError) as info:
        config(f"{key}=dsik")
    assert key in str(info.value) and "module:Class" in str(info.value)


def test_a_plugin_path_that_cannot_be_imported_says_why():
    cfg = config("training.backend=no_such_module:Backend")
    with pytest.raises(NotFoundError) as info:
        backend_class(cfg.training)
    assert "training.backend" in info.value.message and "no_such_module" in info.value.message


def test_the_distributed_transport_joins_tp_size_ranks_per_sglang_server():
    class Client:
        urls = ["http://127.0.0.1:1"]

        def use_adapter(self, name):  # the run's client: which LoRA adapter its requests name
            self.adapter = name

    sglang = make_transport(config("training.weight_sync=distributed", "inference.engine=sglang", "inference.tp_size=4"),
                            Client(), "/tmp")
    embedded = make_transport(config("training.weight_sync=distributed", "inference.tp_size=4"), Client(), "/tmp")
    assert isinstance(sglang, DistributedTransport) and sglang.ranks_per_server == 4
    assert embedded.ranks_per_server == 1  # the embedded server joins one rank whatever tp_size says
