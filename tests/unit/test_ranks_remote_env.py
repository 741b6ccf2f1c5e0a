"""On several hosts the `deepspeed` launcher passes its ranks only PYTHON* variables and the lines of
its `.deepspeed_env` file, so the rank variables agentrl sets go to a file of the run's own that
DS_ENV_FILE names, followed by the user's own file's lines (which win, being later)."""

from __future__ import annotations

import os

from agentrl_cli.learner.ranks_backend import ENV_FILE, with_remote_environment

RANK_ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0",
            "AGENTRL_OBSERVE__LOG_LEVEL": "info", "PATH": "/usr/bin", "PYTHONPATH": "/src", "NCCL_SOCKET_IFNAME": ""}


def test_the_rank_variables_the_launcher_drops_go_to_the_file_ds_env_file_names(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    env = with_remote_environment(dict(RANK_ENV), tmp_path)
    path = tmp_path / ENV_FILE
    assert env == {**RANK_ENV, "DS_ENV_FILE": str(path)}
    # PATH is the ssh session's own and PYTHON* the launcher exports itself; an empty value is not set
    assert path.read_text().splitlines() == ["DS_ACCELERATOR=cpu", "OMP_NUM_THREADS=1", "GLOO_SOCKET_IFNAME=eth0",
                                             "AGENTRL_OBSERVE__LOG_LEVEL=info"]
    # the launcher joins the name to ~ and to its working directory: an absolute name is the file itself, both times
    assert os.path.join(os.path.expanduser("~"), env["DS_ENV_FILE"]) == os.path.join(".", env["DS_ENV_FILE"]) == str(path)


def test_the_users_own_deepspeed_env_files_still_apply_after_the_runs_variables(tmp_path, monkeypatch):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / ".deepspeed_env").write_text("NCCL_IB_DISABLE=1\n\nOMP_NUM_THREADS=4\n")
    (work / "my_env").write_text("UCX_TLS=tcp\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    with_remote_environment({"OMP_NUM_THREADS": "1"}, tmp_path)
    assert (tmp_path / ENV_FILE).read_text().splitlines() == ["OMP_NUM_THREADS=1", "NCCL_IB_DISABLE=1", "OMP_NUM_THREADS=4"]  # blank lines dropped: the launcher cannot split them
    with_remote_environment({"DS_ENV_FILE": "my_env"}, tmp_path)  # their DS_ENV_FILE names the file to look for
    assert (tmp_path / ENV_FILE).read_text() == "UCX_TLS=tcp\n"
