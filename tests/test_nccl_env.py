"""The workers' environment jit-run builds for ProcessGroupNCCL: PyTorch must not end a survivor first.

On a peer failure the healthy ranks must live until their JIT save is done:
``--hang-timeout`` (detection) plus ``--save-grace`` (the save).  PyTorch's
ProcessGroupNCCL has two ways to end them sooner (torch 2.13,
``torch/csrc/distributed/c10d/ProcessGroupNCCL.{hpp,cpp}``):

* its watchdog, on an NCCL error or a collective timeout, aborts the
  communicators and/or rethrows in its thread (the process ends) after a
  60 s flight-recorder pause, as ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` says
  (torchrun's agent sets 1, tear-down, when it is unset);
* its heartbeat monitor, once any rank flagged a timeout or error, ends the
  process ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` later (default 480 s).

These tests check the environment ``launcher.prepare()`` builds: 0 (no
handling) and a heartbeat timeout past the save, a user's own setting kept,
and one warning line when the user's setting would beat the save.  What
PyTorch then does on a real NCCL job is unverified on GPU.
"""

from __future__ import annotations

import pytest

from jitckpt.launch import launcher

NCCL_ENV = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
            "TORCH_NCCL_ENABLE_MONITORING", "JITCKPT_HANG_TIMEOUT", "JITCKPT_SAVE_GRACE", "JITCKPT_INTERPOSE")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NCCL_ENV:
        monkeypatch.delenv(name, raising=False)


def prepared(tmp_path, *options: str) -> dict[str, str]:
    args = launcher.build_parser().parse_args(
        ["--checkpoint-dir", str(tmp_path / "ckpt"), "--interpose", "off", *options,
         "torchrun", "--nproc_per_node", "2", "train.py"])
    _, env, _ = launcher.prepare(args)
    return env


def warnings_of(capsys: pytest.CaptureFixture[str], name: str) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "warning" in line and name in line]


def test_nccl_error_handling_is_off_and_the_heartbeat_outlasts_the_save(tmp_path, capsys):
    env = prepared(tmp_path, "--hang-timeout", "30", "--save-grace", "90")
    # No abort, no tear-down on an NCCL error or timeout: the JIT save decides when the worker ends.
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    # The heartbeat monitor ends the process only after hang timeout + save grace (+ a minute).
    assert int(env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]) >= 30 + 90 + 60
    assert "TORCH_NCCL_ENABLE_MONITORING" not in env  # the monitor stays on for real watchdog hangs
    assert not warnings_of(capsys, "TORCH_NCCL")


def test_the_heartbeat_follows_the_defaults(tmp_path):
    env = prepared(tmp_path)
    assert int(env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]) >= 60 + 60 + 60  # default hang timeout and grace


def test_a_users_settings_are_kept_and_a_harmless_one_is_not_warned_about(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    monkeypatch.setenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "3600")
    env = prepared(tmp_path, "--hang-timeout", "30", "--save-grace", "60")
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "3600"
    assert not warnings_of(capsys, "TORCH_NCCL")


def test_a_users_tear_down_setting_is_kept_with_one_warning(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env = prepared(tmp_path, "--hang-timeout", "30", "--save-grace", "60")
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    lines = warnings_of(capsys, "TORCH_NCCL_ASYNC_ERROR_HANDLING")
    assert len(lines) == 1 and "=1 (yours)" in lines[0] and "JIT save" in lines[0] and "90s" in lines[0], lines


def test_the_legacy_name_counts_as_the_users_setting(tmp_path, capsys, monkeypatch):
    """NCCL_ASYNC_ERROR_HANDLING alone: torchrun would otherwise override it with TORCH_...=1."""
    monkeypatch.setenv("NCCL_ASYNC_ERROR_HANDLING", "2")
    env = prepared(tmp_path)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2" and env["NCCL_ASYNC_ERROR_HANDLING"] == "2"
    assert len(warnings_of(capsys, "TORCH_NCCL_ASYNC_ERROR_HANDLING=2")) == 1


def test_a_users_short_heartbeat_is_kept_with_one_warning_unless_monitoring_is_off(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "60")
    env = prepared(tmp_path, "--hang-timeout", "30", "--save-grace", "60")
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "60"
    lines = warnings_of(capsys, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC")
    assert len(lines) == 1 and "=60 (yours)" in lines[0] and "90s" in lines[0], lines
    monkeypatch.setenv("TORCH_NCCL_ENABLE_MONITORING", "0")  # the monitor never ends the process then
    prepared(tmp_path, "--hang-timeout", "30", "--save-grace", "60")
    assert not warnings_of(capsys, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC")
