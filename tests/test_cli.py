"""jit-run's command line: bad input is rejected before anything starts, with the cause and the fix."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings

import pytest

from conftest import REPO, job_env
from jitckpt.launch import launcher


def jit_run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jitckpt", *args], capture_output=True, text=True,
                          env=env or job_env(), timeout=120, cwd=REPO)


def test_unwritable_checkpoint_dir_fails_at_start_up(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = jit_run("--checkpoint-dir", str(blocker / "ckpt"), "torchrun", "--nproc_per_node", "2", "examples/train_mlp.py")
    assert result.returncode == 2
    assert "not writable" in result.stderr and "--checkpoint-dir" in result.stderr
    assert "launching torchrun" not in result.stderr  # nothing was started


def test_command_must_be_torchrun(tmp_path):
    result = jit_run("--checkpoint-dir", str(tmp_path), "python", "train.py")
    assert result.returncode == 2
    assert "jit-run runs torchrun jobs" in result.stderr


def test_bad_fault_spec_is_rejected(tmp_path):
    result = jit_run("--checkpoint-dir", str(tmp_path), "--fault", "rank=1,step=2,phase=lunch,kind=kill",
                     "torchrun", "x.py")
    assert result.returncode == 2 and "phase must be one of" in result.stderr


@pytest.mark.parametrize("option", ["--hang-timeout", "--save-grace"])
@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf", "nan", "1e999"])
def test_nonsense_durations_are_rejected(tmp_path, option, value):
    result = jit_run("--checkpoint-dir", str(tmp_path), option, value, "torchrun", "x.py")
    assert result.returncode == 2 and option in result.stderr and "must be a finite number > 0" in result.stderr


def test_missing_pytorch_is_named(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert launcher.main(["--checkpoint-dir", str(tmp_path), "torchrun", "x.py"]) == 2
    assert "PyTorch is not installed" in capsys.readouterr().err


def test_options_can_come_from_the_environment(tmp_path):
    env = job_env()
    env["JITCKPT_HANG_TIMEOUT"] = "-1"
    result = jit_run("--checkpoint-dir", str(tmp_path), "torchrun", "x.py", env=env)
    assert result.returncode == 2 and "must be a finite number > 0" in result.stderr


@pytest.mark.parametrize("value", ["0", "inf", "nan", "later"])
def test_a_nonsense_agreement_timeout_is_refused_before_any_worker_starts(tmp_path, value):
    env = job_env()
    env["JITCKPT_AGREEMENT_TIMEOUT"] = value
    result = jit_run("--checkpoint-dir", str(tmp_path), "torchrun", "x.py", env=env)
    assert result.returncode == 2 and "JITCKPT_AGREEMENT_TIMEOUT must be a finite number > 0" in result.stderr


def test_rs_without_isa_l_and_nonsense_group_sizes_are_refused_before_any_worker_starts(tmp_path):
    env = job_env()
    env["JITCKPT_ISAL_LIBRARY"] = str(tmp_path / "no-libisal.so")
    result = jit_run("--checkpoint-dir", str(tmp_path), "--memory-redundancy", "rs", "torchrun", "x.py", env=env)
    assert result.returncode == 2 and "--memory-redundancy rs" in result.stderr, result.stderr
    assert "ISA-L" in result.stderr and "pip install 'jitckpt[rs]'" in result.stderr, result.stderr
    assert "launching torchrun" not in result.stderr
    for name, value, said in (("JITCKPT_MEMORY_GROUP", "0", "JITCKPT_MEMORY_GROUP must be"),
                              ("JITCKPT_MEMORY_PARITIES", "two", "JITCKPT_MEMORY_PARITIES must be"),
                              ("JITCKPT_MEMORY_COPIES", "-1", "JITCKPT_MEMORY_COPIES must be"),
                              ("JITCKPT_MEMORY_XOR_GROUP", "2", "is now JITCKPT_MEMORY_GROUP")):
        env = job_env()
        env[name] = value
        result = jit_run("--checkpoint-dir", str(tmp_path), "--memory-redundancy", "rs", "torchrun", "x.py", env=env)
        assert result.returncode == 2 and said in result.stderr, result.stderr


def test_admin_switch_turns_jit_run_into_a_pass_through(tmp_path):
    env = job_env()
    env["JITCKPT_ENABLE"] = "0"
    result = jit_run(sys.executable, "-c", "import os; print('ACTIVE', os.environ.get('JITCKPT_ACTIVE'))", env=env)
    assert result.returncode == 0 and "ACTIVE None" in result.stdout


def test_api_outside_jit_run_is_a_noop_with_one_warning(monkeypatch):
    import jitckpt
    from jitckpt import api

    monkeypatch.setattr(api, "_warned_inactive", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jitckpt.register_save_checkpoint(lambda path: None)
        assert jitckpt.jit_get_checkpoint_path() is None
    assert len([w for w in caught if issubclass(w.category, api.JitckptInactiveWarning)]) == 1
    with pytest.raises(TypeError):
        jitckpt.register_save_checkpoint("not callable")


def test_emulator_path_points_at_the_emulated_runtime():
    result = jit_run("emulator-path")
    assert result.returncode == 0, result.stderr
    from pathlib import Path

    build = Path(result.stdout.strip())
    assert (build / "libcudart.so.13").is_file() and (build / "libnccl.so.2").is_file()


def test_emulated_gpus_puts_the_emulator_first_on_the_library_path(tmp_path):
    from jitckpt.native import emulator

    env = emulator.job_environment({"LD_LIBRARY_PATH": "/opt/x"}, devices=4)
    assert env["LD_LIBRARY_PATH"].split(":") == [str(emulator.library_dir()), "/opt/x"]
    assert env["JITCKPT_SIMDEV_DEVICES"] == "4"
    result = jit_run("--checkpoint-dir", str(tmp_path), "--emulated-gpus", "0", "torchrun", "x.py")
    assert result.returncode == 2 and "--emulated-gpus" in result.stderr


def test_interposer_is_preloaded_with_emulated_gpus_and_not_by_default(tmp_path):
    from jitckpt.native import interposer as interpose

    args = launcher.build_parser().parse_args(["--checkpoint-dir", str(tmp_path), "torchrun", "x.py"])
    _, env, _ = launcher.prepare(args)
    assert "libjitckpt_interpose" not in env.get("LD_PRELOAD", "")
    args = launcher.build_parser().parse_args(["--checkpoint-dir", str(tmp_path), "--emulated-gpus", "2", "torchrun", "x.py"])
    _, env, _ = launcher.prepare(args)
    assert env["LD_PRELOAD"].split()[0] == str(interpose.library_path())
    args = launcher.build_parser().parse_args(["--checkpoint-dir", str(tmp_path), "--emulated-gpus", "2", "--interpose", "off",
                                               "torchrun", "x.py"])
    _, env, _ = launcher.prepare(args)
    assert "libjitckpt_interpose" not in env.get("LD_PRELOAD", "")


def test_the_workers_port_is_picked_below_the_ephemeral_range(tmp_path):
    """torch's agent picks MASTER_PORT by binding port 0 (an ephemeral port) and letting it go until rank 0 binds
    it; an outgoing connection given that port meanwhile made rank 0 fail with EADDRINUSE (seen in CI).  jit-run's
    agent picks a free port below the ephemeral range, which the kernel never hands out by itself."""
    from jitckpt.launch import agent

    ephemeral = agent._port_range()
    if ephemeral is None or ephemeral[0] <= agent._PORT_FLOOR + 1000:
        pytest.skip("needs Linux's /proc/sys/net/ipv4/ip_local_port_range, with room below it")
    assert all(agent._PORT_FLOOR <= agent.free_port() < ephemeral[0] for _ in range(20))
    script = tmp_path / "port.py"
    script.write_text("import os\nprint('MASTER_PORT', os.environ['MASTER_PORT'], flush=True)\n")
    result = jit_run("--checkpoint-dir", str(tmp_path / "ckpt"), "torchrun", "--standalone", "--nproc-per-node=2",
                     str(script))
    assert result.returncode == 0, result.stdout + result.stderr
    ports = {int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("MASTER_PORT ")}
    assert len(ports) == 1 and agent._PORT_FLOOR <= ports.pop() < ephemeral[0], result.stdout
