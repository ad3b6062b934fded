"""``python -m jitckpt.transparent.rendezvous``: the recovery rendezvous of transparent mode.

The remote library runs it once per rank during a recovery; its contract is
in ``jitckpt/transparent/rendezvous.py``.  Here it runs against a real
``TCPStore`` the test hosts on a free loopback port (``is_master=True``), as
torchrun's agent hosts one for its workers: three ranks exchange their
tokens, a missing rank is named after the timeout, bad reports and bad
environments are refused before torch is even imported, and an unreachable
store is exit status 4.  Every message is checked for its prefix.  The
rendezvous speaks the store's protocol itself (``store_client.py``): the
tests run it where torch cannot be imported, and check the fallback to
torch's client for a store that answers otherwise.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from conftest import REPO, job_env
from jitckpt.transparent import rendezvous

PREFIX = "jitckpt transparent rendezvous: "


@pytest.fixture()
def store():
    """A TCPStore server on a free loopback port, as torchrun's agent hosts one."""
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    yield server
    del server


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    env = job_env()
    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", rendezvous.ENV_TIMEOUT):
        env.pop(name, None)
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    env.update(extra)
    return env


def start(rank: int, world: int, port: int, token: bytes, generation: str = "1", **extra: str) -> subprocess.Popen:
    read_end, write_end = os.pipe()  # the whole report is in the pipe before the process starts
    os.write(write_end, token)
    os.close(write_end)
    try:
        return subprocess.Popen([sys.executable, "-m", "jitckpt.transparent.rendezvous", "--generation", generation],
                                env=rank_env(rank, world, port, **extra), cwd=REPO, stdin=read_end,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        os.close(read_end)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(), err.decode()


def all_prefixed(stderr: str) -> bool:
    return all(line.startswith(PREFIX) for line in stderr.splitlines())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_three_ranks_get_every_token_sorted_by_rank(store) -> None:
    tokens = {0: b"proxy-ok:gen7:" + b"a" * 40, 1: b"driver-suspect", 2: b"x" * rendezvous.MAX_TOKEN}
    extra = {"TORCHELASTIC_RUN_ID": "job42", "TORCHELASTIC_RESTART_COUNT": "3"}
    procs = {rank: start(rank, 3, store.port, token + b"\n", generation="7", **extra)
             for rank, token in sorted(tokens.items(), reverse=True)}
    expected = "".join(f"{rank} {tokens[rank].decode()}\n" for rank in range(3))
    for rank, proc in procs.items():
        status, out, err = finish(proc)
        assert status == 0, f"rank {rank}: {err}"
        assert out == expected and err == ""
    # The keys are the contract's: jitckpt/transparent/{run_id}/{restart_count}/{generation}/{rank}.
    for rank, token in tokens.items():
        assert store.get(f"jitckpt/transparent/job42/3/7/{rank}") == token


def test_timeout_names_the_rank_that_did_not_report(store) -> None:
    store.set("jitckpt/transparent/none/0/2/1", "already-here")  # rank 1 reported (defaults: run none, restart 0)
    began = time.monotonic()
    status, out, err = finish(start(0, 3, store.port, b"tok0\n", generation="2",
                                    **{rendezvous.ENV_TIMEOUT: "2"}))
    assert status == 3 and out == ""
    assert all_prefixed(err) and "timed out after 2s" in err
    assert "rank 2 of 3 did not report" in err and "rank 1" not in err and "generation 2" in err
    assert time.monotonic() - began < 60


def test_another_generation_does_not_count(store) -> None:
    """Keys of an earlier recovery (generation 1) never complete a later one."""
    for rank in range(2):
        store.set(f"jitckpt/transparent/none/0/1/{rank}", f"old{rank}")
    status, out, err = finish(start(0, 2, store.port, b"new0\n", generation="2", **{rendezvous.ENV_TIMEOUT: "1"}))
    assert status == 3 and "rank 1 of 2 did not report" in err


@pytest.mark.parametrize("report, why", [
    (b"two words\n", "byte 0x20"),
    (b"tab\there\n", "byte 0x09"),
    (b"caf\xc3\xa9\n", "byte 0xc3"),
    (b"\n", "empty line"),
    (b"", "no report on stdin"),
    (b"no-newline", "does not end with a newline"),
    (b"y" * (rendezvous.MAX_TOKEN + 1) + b"\n", f"longer than {rendezvous.MAX_TOKEN} bytes"),
    (b"y" * (rendezvous.MAX_TOKEN + 10), f"longer than {rendezvous.MAX_TOKEN} bytes"),
])
def test_bad_report_is_refused_with_status_2(report: bytes, why: str) -> None:
    err = io.StringIO()
    status = rendezvous.main(["--generation", "1"], environ=rank_env(0, 2, 29500), stdin=io.BytesIO(report),
                             stdout=io.StringIO(), stderr=err)
    assert status == 2 and why in err.getvalue() and all_prefixed(err.getvalue()), err.getvalue()


@pytest.mark.parametrize("argv, env, why", [
    ([], {}, "bad arguments"),
    (["--generation"], {}, "bad arguments"),
    (["--generation", "x"], {}, "--generation must be a non-negative integer"),
    (["--generation", "-1"], {}, "--generation must be a non-negative integer"),
    (["--generation", "1", "extra"], {}, "bad arguments"),
    (["--generation", "1"], {"RANK": "2"}, "RANK='2' is not an integer 0..1"),
    (["--generation", "1"], {"WORLD_SIZE": "0"}, "WORLD_SIZE='0'"),
    (["--generation", "1"], {"MASTER_ADDR": ""}, "MASTER_ADDR is not set"),
    (["--generation", "1"], {"MASTER_PORT": "70000"}, "MASTER_PORT='70000'"),
    (["--generation", "1"], {"TORCHELASTIC_RESTART_COUNT": "two"}, "TORCHELASTIC_RESTART_COUNT"),
    (["--generation", "1"], {"TORCHELASTIC_RUN_ID": "a/b"}, "TORCHELASTIC_RUN_ID"),
    (["--generation=1"], {rendezvous.ENV_TIMEOUT: "0"}, rendezvous.ENV_TIMEOUT),
    (["--generation=1"], {rendezvous.ENV_TIMEOUT: "nan"}, rendezvous.ENV_TIMEOUT),
])
def test_bad_arguments_or_environment_are_refused_with_status_2(argv: list[str], env: dict[str, str], why: str) -> None:
    environ = rank_env(0, 2, 29500)
    for name, value in env.items():
        if value == "":
            environ.pop(name)
        else:
            environ[name] = value
    err = io.StringIO()
    status = rendezvous.main(argv, environ=environ, stdin=io.BytesIO(b"tok\n"), stdout=io.StringIO(), stderr=err)
    assert status == 2 and why in err.getvalue() and all_prefixed(err.getvalue()), err.getvalue()


def test_bad_input_fails_before_torch_is_imported() -> None:
    """A bad report costs no `import torch` (which dominates the start-up)."""
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; from jitckpt.transparent import rendezvous as r; s = r.main(); "
                           "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(s)", "--generation", "1"],
                          env=rank_env(0, 2, 29500), cwd=REPO, input=b"bad token\n", capture_output=True, timeout=60)
    assert proc.returncode == 2, proc.stderr.decode()
    assert proc.stderr.decode().startswith(PREFIX)


def test_unreachable_store_is_status_4_with_one_clean_message() -> None:
    port = free_port()  # nobody listens there
    status, out, err = finish(start(0, 2, port, b"tok\n", **{rendezvous.ENV_TIMEOUT: "1"}))
    assert status == 4 and out == ""
    assert all_prefixed(err), err  # c10d's own log lines and stack traces are kept off stderr
    assert f"cannot reach torchrun's store at 127.0.0.1:{port}" in err


def test_help_and_module_entry_point() -> None:
    proc = subprocess.run([sys.executable, "-m", "jitckpt.transparent.rendezvous", "--help"], cwd=REPO,
                          env=job_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--generation G" in proc.stdout
    assert Path(rendezvous.__file__).name == "rendezvous.py" and os.sep + "transparent" + os.sep in rendezvous.__file__


# ---- jitckpt's own store client (no torch) ---------------------------------------------------------


def test_three_ranks_meet_without_importing_torch(store, tmp_path) -> None:
    """The rendezvous speaks the store's protocol itself: a `torch` that cannot be imported changes nothing."""
    fake = tmp_path / "no-torch"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('torch must not be imported here')\n")
    pythonpath = os.pathsep.join([str(fake), str(REPO)])
    procs = {rank: start(rank, 3, store.port, f"plain{rank}\n".encode(), generation="4", PYTHONPATH=pythonpath)
             for rank in range(3)}
    for rank, proc in procs.items():
        status, out, err = finish(proc)
        assert status == 0 and err == "", err
        assert out == "0 plain0\n1 plain1\n2 plain2\n"
    # the keys are torch's: its own client reads them
    assert store.get("jitckpt/transparent/none/0/4/1") == b"plain1"


def test_the_plain_client_gives_up_a_wait_cleanly(store) -> None:
    """StoreClient.wait's timeout cancels the wait on the server, and the connection stays usable."""
    from jitckpt.transparent.store_client import StoreClient, StoreTimeout

    client = StoreClient("127.0.0.1", store.port, 10)
    started = time.monotonic()
    with pytest.raises(StoreTimeout):
        client.wait(["never/there"], 0.3)
    assert time.monotonic() - started < 5
    client.set("later", b"value")
    assert client.check(["later"]) and not client.check(["never/there"])
    assert client.multi_get(["later"]) == [b"value"]
    assert store.get("later") == b"value"
    client.close()


def test_a_store_speaking_another_protocol_falls_back_to_torchs_client(monkeypatch, capsys) -> None:
    """A server that does not echo the PING nonce: the rendezvous says so and uses torch's TCPStore class."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def odd_server() -> None:
        conn, _ = listener.accept()
        conn.recv(64)
        conn.sendall(b"\xff\xff\xff\xff")  # not the nonce
        time.sleep(1)
        conn.close()

    threading.Thread(target=odd_server, daemon=True).start()
    used = []

    class TorchLikeStore:
        def __init__(self, host, port, is_master, timeout):
            used.append((host, port, is_master))
            self.data = {}

        def set(self, key, value):
            self.data[key] = value.encode() if isinstance(value, str) else value

        def wait(self, keys, timeout):
            assert all(k in self.data for k in keys)

        def multi_get(self, keys):
            return [self.data[k] for k in keys]

    monkeypatch.setattr(rendezvous, "_store_class", lambda: TorchLikeStore)
    settings = rendezvous.read_settings(1, rank_env(0, 1, listener.getsockname()[1], **{rendezvous.ENV_TIMEOUT: "5"}))
    assert rendezvous.exchange(settings, "tok0") == [(0, "tok0")]
    assert used == [("127.0.0.1", listener.getsockname()[1], False)]
    assert "does not speak the protocol jitckpt's own client knows" in capsys.readouterr().err
    listener.close()
