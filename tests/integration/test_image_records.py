"""Issue 47, pinned and recorded, against real bubblewrap in a tiny image the test makes from the
host's sh, cat and ls: stage 5's image checks report the image's os-release and find a file created
on the host just now absent inside (while a host-rooted sandbox sees it); a sandboxed harness
built as the run builds it knows the image its episode runs in, and the rollout puts that digest on
the episode's records."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

from agentrl_cli.acceptance.image_checks import host_only_absent, image_checks, pretty_name
from agentrl_cli.config import load_config
from agentrl_cli.core.report import CheckStatus
from agentrl_cli.envs.sandbox import SandboxSettings
from agentrl_cli.runtime.data.schema import TrajectoryRecord
from tests.image_layouts import tiny_image, traversable_dir
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


@pytest.fixture(scope="module")
def image_dirs():
    d = traversable_dir("agentrl-test-imgrec-")
    tiny_image(d / "layout")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def rooted(image_dirs, sandbox_root) -> SandboxSettings:
    return SandboxSettings(root_dir=sandbox_root, image_cache_dir=image_dirs / "cache").with_image(
        f"oci:{image_dirs / 'layout'}:tiny")


def test_stage5_reports_the_images_release_and_finds_a_host_only_file_absent_inside(rooted):
    release, absent = image_checks("terminal_like", rooted)
    assert release.status == CheckStatus.INFO and release.name == "harness terminal_like: image os-release"
    assert release.measured == {"image": rooted.image, "digest": rooted.image_digest, "pretty_name": "agentrl tiny"}
    assert absent.status == CheckStatus.PASS, absent.detail
    assert absent.measured["visible_in_image"] is False
    assert absent.measured["visible_on_host_root"] is True  # the control: a host-rooted sandbox would have seen it
    assert absent.measured["path"] in absent.detail


def test_a_host_root_shows_the_host_only_file_so_the_check_would_fail(sandbox_root):
    host = SandboxSettings(root_dir=sandbox_root)  # no image: the host's /usr is bound, the file is visible
    check = host_only_absent("terminal_like", host)
    assert check.status == CheckStatus.FAIL and check.measured["visible_in_image"] is True and check.hint


def test_pretty_name_is_read_from_os_release_text():
    assert pretty_name('NAME="Debian"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n') == "Debian GNU/Linux 12 (bookworm)"
    assert pretty_name("NAME=x\n") is None


def test_a_sandboxed_harness_records_the_image_its_episode_ran_in(image_dirs, sandbox_root):
    from agentrl_cli.runtime.observe.harness_stats import HarnessStats
    from agentrl_cli.runtime.rollout.episode_scaffold import Lent, account
    from harnesses.registry import create

    image = f"oci:{image_dirs / 'layout'}:tiny"
    cfg = load_config(None, [f"harnesses.0.image={image}", f"sandbox.image_cache_dir={image_dirs / 'cache'}",
                             f"sandbox.root_dir={sandbox_root}"], env={}).config
    h = create("terminal_like", cfg)
    try:
        h.reset(h.task_set().select("train")[0])
        digest = h.sandbox.settings.image_digest
        assert digest.startswith("sha256:") and h.episode_image_digest == digest
        h.end_episode()
        lent = Lent(h, h.episode_resources, h.episode_image_digest)  # as `lend` hands it back
        records = [TrajectoryRecord(run_id="r", task_id="t", harness="terminal_like", harness_version="1")]
        account(SimpleNamespace(harness_stats=HarnessStats()), "terminal_like", lent, records)
        assert records[0].image_digest == digest
    finally:
        h.close()
