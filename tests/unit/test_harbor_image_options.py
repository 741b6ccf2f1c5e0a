"""The Harbor adapter's image options (`harnesses/adapters/harbor_image.py`) are checked when the
harness is made: a wrong build mode, a malformed base_images or a registry fallback image is refused
naming the option and the fix; `build: off` (the default) falls back without running anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.envs.images import ImageError
from harnesses.adapters.harbor_image import ImagePolicy


def test_a_wrong_build_mode_or_base_images_is_refused_naming_the_option():
    with pytest.raises(ConfigError, match="options.build: 'always'") as err:
        ImagePolicy(build="always")
    assert "off, auto, required" in err.value.hint
    with pytest.raises(ConfigError, match="options.base_images"):
        ImagePolicy(build="auto", base_images={"python:3.12-slim": 3})


def test_a_registry_fallback_image_is_refused_when_the_harness_is_made():
    with pytest.raises(ImageError, match="registry reference"):
        ImagePolicy(fallback_image="docker.io/library/python:3.12-slim")


def test_build_off_is_the_default_and_runs_the_task_in_the_fallback_saying_so(tmp_path: Path):
    image = ImagePolicy(build_dir=str(tmp_path)).for_task(tmp_path)
    assert image.record() == {"environment": "fallback", "image": "host", "digest": None,
                              "reason": "build is off (harnesses[harbor].options.build)"}
    assert list(tmp_path.iterdir()) == [], "nothing was built"
