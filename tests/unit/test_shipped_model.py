"""The built-in model shipped in the package (agentrl_cli/model/shipped.py): it is this recipe's, a
first use installs it without building, and a copy that fails its checksum is built instead, the
reason shown. That a rebuild from the recipe meets the same quality bar is
tests/e2e/test_shipped_model_rebuild.py (`-m long`: it builds for several minutes)."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import LlamaConfig

from agentrl_cli.model import resolve, shipped
from agentrl_cli.model.chat_template import CHAT_TEMPLATE
from agentrl_cli.model.recipe import PRACTICE_PER_FAMILY, SFT_STEPS, WARM_START_HARNESSES
from agentrl_cli.model.tiny import ARCH, COMPLETE, RECIPE_VERSION, tiny_config
from agentrl_cli.model.tokenizer import build_tokenizer

REBUILD = "rebuild it: python -m agentrl_cli.model.shipped (about 10 minutes), then commit agentrl_cli/model/weights"


def test_the_shipped_model_is_this_recipes_and_checks_out():
    source = shipped.shipped_dir()
    assert shipped.problem() is None, f"{shipped.problem()}: {REBUILD}"
    card = json.loads((source / COMPLETE).read_text())
    assert card["recipe_version"] == RECIPE_VERSION and card["kind"] == "sft" and card["arch"] == ARCH, REBUILD
    assert card["demonstrations"]["harnesses"] == list(WARM_START_HARNESSES), REBUILD
    assert card["demonstrations"]["practice_per_family"] == PRACTICE_PER_FAMILY and card["sft"]["steps"] == SFT_STEPS, REBUILD
    tokenizer = build_tokenizer()
    ignore = {"transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path"}
    config = {k: v for k, v in LlamaConfig.from_pretrained(source).to_dict().items() if k not in ignore}
    assert config == {k: v for k, v in tiny_config(tokenizer).to_dict().items() if k not in ignore}, REBUILD
    shipped_tokenizer = json.loads((source / "tokenizer.json").read_text())
    assert shipped_tokenizer == json.loads(tokenizer.backend_tokenizer.to_str()), REBUILD  # the tokenizer it was built with
    assert (source / "chat_template.jinja").read_text() == CHAT_TEMPLATE, REBUILD


def test_a_first_use_installs_the_shipped_model_and_builds_nothing(tmp_path, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("built instead of installed")

    monkeypatch.setattr(resolve, "build_tiny", no_build)
    seen = []
    path = resolve.resolve_model_path("builtin:tiny-agent", str(tmp_path), progress=lambda *a: seen.append(a))
    assert path == resolve.builtin_dir(str(tmp_path))
    assert (path / "model.safetensors").read_bytes() == (shipped.shipped_dir() / "model.safetensors").read_bytes()
    card = json.loads((path / COMPLETE).read_text())
    assert card["installed"]["from"].startswith("shipped with the agentrl package") and card["sft"]["steps"] == SFT_STEPS
    assert not (path / shipped.SUMS).exists() and [p.name for p in tmp_path.joinpath("models").iterdir()
                                                   if p.name.startswith(".") and p.is_dir()] == []  # no temporary left
    assert resolve.resolve_model_path("builtin:tiny-agent", str(tmp_path), build=False) == path  # found the next time


@pytest.mark.parametrize("damage", ["flipped byte", "missing file", "other recipe"])
def test_a_shipped_copy_that_cannot_be_used_is_built_instead_naming_why(tmp_path, monkeypatch, damage):
    copy = shutil.copytree(shipped.shipped_dir(), tmp_path / "shipped")
    weights = copy / "model.safetensors"
    if damage == "flipped byte":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 1
        weights.write_bytes(bytes(data))
        expected = "model.safetensors does not match its checksum"
    elif damage == "missing file":
        weights.unlink()
        expected = "lacks model.safetensors"
    else:
        card = json.loads((copy / COMPLETE).read_text())
        (copy / COMPLETE).write_text(json.dumps({**card, "recipe_version": "0"}))
        shipped.ship(copy, copy)  # its sums made again: only the recipe differs
        expected = f"recipe 0, this agentrl's is {RECIPE_VERSION}"
    monkeypatch.setattr(shipped, "shipped_dir", lambda: copy)
    built = []
    monkeypatch.setattr(resolve, "build_tiny", lambda dest, progress: built.append(dest) or dest)
    seen = []
    dest = tmp_path / "cache" / "tiny"
    assert resolve.install_builtin(dest, progress=lambda phase, done, total: seen.append(phase)) == dest
    assert built == [dest] and expected in seen[0] and "building it from the recipe" in seen[0]
    with pytest.raises(ValueError, match=expected.split(",")[0]):
        shipped.install(dest, copy)
