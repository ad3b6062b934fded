"""The ``ncclorder`` test backend (tests/nccl_order) behaves as torch's ProcessGroupNCCL documents.

Small 2-rank programs, one per scenario; each prints ``CHECK name value``
lines that several tests read.  What is checked:

- completion: ``Work.wait()`` and the future complete at enqueue (a ``then``
  callback runs on the caller's thread), ``is_completed()`` is false until the
  collective finished;
- the host runs ahead of the device: an in-place update of a pending tensor,
  DDP's backward and Adam's step return while the all-reduce is pending (the
  step counters move); ``.item()`` and ``tolist()`` block until it finished;
- blocking points: ``barrier()`` and, with ``TORCH_NCCL_BLOCKING_WAIT=1``,
  ``Work.wait()`` block the host;
- DDP's comm hook runs on a device thread while the training thread waits in
  ``backward()``;
- errors: a lost peer makes ``is_completed()`` true with ``exception()`` set,
  ``get_error()`` non-``SUCCESS``, ``wait()`` raise, and later collectives on the
  aborted communicator fail too; a consumer queued behind the failed
  collective waits for the failure, then runs (the abort lets the streams go on);
- FSDP2 and ZeroRedundancyOptimizer end bit-identical to gloo.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, job_env

DELAY = 2.0  # seconds rank 1 holds a collective back; rank 0's host must not wait for it until a blocking point

PROGRAM = textwrap.dedent(
    """
    import os, sys, threading, time
    import torch, torch.distributed as dist, torch.nn as nn
    import nccl_order

    rank, scenario, backend, init = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    DELAY = float(os.environ["NCCLORDER_TEST_DELAY"])
    nccl_order.register()
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=2)
    pg = dist.group.WORLD

    def check(name, value):
        print(f"CHECK {name} {value}", flush=True)

    def since(start):
        return round(time.monotonic() - start, 3)

    t = torch.ones(4)
    dist.all_reduce(t)                      # both ranks connected
    assert t.tolist() == [2.0] * 4, t

    def completion():
        if rank == 1:
            time.sleep(DELAY)               # rank 0's collective cannot finish before this
        t = torch.ones(4)
        start = time.monotonic()
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        check("wait_seconds", since(start))
        fut = work.get_future()
        ran_on = fut.then(lambda f: threading.current_thread().name)
        check("future_done", fut.done() and ran_on.done())
        check("then_thread", ran_on.value())
        check("completed_after_wait", work.is_completed())
        t.mul_(3)                           # an in-place update of the pending tensor: queued, not waited for
        t.add_(1)
        check("inplace_seconds", since(start))
        check("completed_after_inplace", work.is_completed())
        total = t.sum().item()              # the host needs the value: it waits
        check("item_seconds", since(start))
        check("item_value", total)
        check("completed_after_item", work.is_completed())

    def tolist_blocks():
        if rank == 1:
            time.sleep(DELAY)
        t = torch.ones(2)
        start = time.monotonic()
        dist.all_reduce(t, async_op=True)
        doubled = t * 2                     # out-of-place: an empty tensor now, filled on the compute stream
        check("outofplace_seconds", since(start))
        check("tolist_value", doubled.tolist())
        check("tolist_seconds", since(start))

    def barrier_blocks():
        if rank == 1:
            time.sleep(DELAY)
        start = time.monotonic()
        dist.barrier()
        check("barrier_seconds", since(start))

    def blocking_wait():
        os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
        group = dist.new_group([0, 1])      # read when the communicator is created, as ProcessGroupNCCL does
        del os.environ["TORCH_NCCL_BLOCKING_WAIT"]
        if rank == 1:
            time.sleep(DELAY)
        t = torch.ones(4)
        start = time.monotonic()
        work = dist.all_reduce(t, group=group, async_op=True)
        work.wait()
        check("blocking_wait_seconds", since(start))
        check("blocking_wait_completed", work.is_completed())

    def ddp_runs_ahead():
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
        hook_threads, main_in_backward = [], []

        def hook(state, bucket):
            hook_threads.append(threading.current_thread().name)
            main = sys._current_frames()[threading.main_thread().ident]
            names = set()
            while main is not None:
                names.add(main.f_code.co_name)
                main = main.f_back
            main_in_backward.append("backward" in names)
            work = dist.all_reduce(bucket.buffer(), async_op=True)
            return work.get_future().then(lambda f: f.value()[0])

        model.register_comm_hook(None, hook)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        if rank == 1:
            time.sleep(DELAY)
        start = time.monotonic()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        check("backward_seconds", since(start))
        opt.step()                          # reads the pending gradients: queued; the step counters run now
        check("step_seconds", since(start))
        check("step_counter", int(opt.state[next(model.parameters())]["step"].item()))
        check("hook_threads", ",".join(sorted(set(hook_threads))))
        check("main_in_backward", all(main_in_backward) and bool(main_in_backward))
        digest = [round(v, 6) for v in next(model.parameters()).detach().flatten()[:4].tolist()]
        check("params_read_seconds", since(start))
        check("params", digest)

    def lost_peer():
        if rank == 1:
            time.sleep(DELAY / 2)
            os._exit(0)                     # vanish without a word, as a killed rank does
        t = torch.ones(4)
        work = dist.all_reduce(t, async_op=True)
        work.wait()                         # before the failure: returns at enqueue
        doubled = t * 2                     # queued behind the collective
        start = time.monotonic()
        doubled.sum().item()                # waits for the failure; then the streams move on (the abort)
        check("consumer_after_abort_seconds", since(start))
        check("lost_completed", work.is_completed())
        error = work.exception()
        check("lost_exception", type(error).__name__ if error is not None else None)
        check("lost_success", work.is_success())
        check("lost_get_error", pg.get_error().name)
        try:
            work.wait()
            check("lost_wait_raised", False)
        except Exception as exc:
            check("lost_wait_raised", type(exc).__name__)
        later = dist.all_reduce(torch.ones(2), async_op=True)
        deadline = time.monotonic() + 30
        while not later.is_completed() and time.monotonic() < deadline:
            time.sleep(0.05)
        check("later_exception", type(later.exception()).__name__ if later.exception() is not None else None)
        os._exit(0)                         # gloo's teardown with a lost peer is not what is tested

    def train(modes):
        import hashlib
        sys.path.insert(0, os.path.join(os.environ["NCCLORDER_TEST_REPO"], "tests", "sharded_programs"))
        from train_sharded import _local, batch, build
        for mode in modes.split(","):
            model, opt = build(mode, 2)
            for step in range(4):
                x, y = batch(step, rank)
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            # This rank's shards: DTensor's full_tensor() is a functional collective, which ncclorder lacks.
            digest = hashlib.sha256()
            for name, value in model.state_dict().items():
                digest.update(name.encode())
                digest.update(_local(value).detach().contiguous().numpy().tobytes())
            check(f"sha_{mode}", digest.hexdigest())

    if scenario == "semantics":
        completion()
        tolist_blocks()
        barrier_blocks()
        blocking_wait()
        ddp_runs_ahead()
    elif scenario == "lost-peer":
        lost_peer()
    elif scenario.startswith("train:"):
        train(scenario.split(":", 1)[1])
    dist.barrier()
    dist.destroy_process_group()
    print(f"RANK {rank} DONE", flush=True)
    # Every check is printed: leave without the interpreter's teardown, which can abort ("terminate called
    # without an active exception", seen once in a full run) on a C++ thread of the stream or device threads.
    os._exit(0)
    """
)


def start_backend_program(tmp_path: Path, scenario: str, backend: str = "ncclorder") -> list[subprocess.Popen]:
    """Start ``PROGRAM``'s ``scenario`` on 2 ranks (one process each, rendezvous in a file)."""
    script = tmp_path / "backend_program.py"
    if not script.exists():  # written once: another pair of ranks may be starting from it
        script.write_text(PROGRAM)
    env = job_env()
    env["PYTHONPATH"] = f"{REPO / 'tests'}:{env['PYTHONPATH']}"
    env["NCCLORDER_TEST_DELAY"] = str(DELAY)
    env["NCCLORDER_TEST_REPO"] = str(REPO)
    env.pop("TORCH_NCCL_BLOCKING_WAIT", None)
    init = f"file://{tmp_path / re.sub(r'[^A-Za-z0-9]', '-', f'rendezvous-{backend}-{scenario}')}"
    return [subprocess.Popen([sys.executable, str(script), str(rank), scenario, backend, init], env=env, cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]


def finish(procs: list[subprocess.Popen]) -> list[subprocess.CompletedProcess]:
    """Both ranks' results (at most 120 s each)."""
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out))
    return results


def run_backend_program(tmp_path: Path, scenario: str, backend: str = "ncclorder") -> list[subprocess.CompletedProcess]:
    return finish(start_backend_program(tmp_path, scenario, backend))


def checks(result: subprocess.CompletedProcess) -> dict[str, str]:
    """The ``CHECK name value`` lines a rank printed."""
    return dict(re.findall(r"^CHECK (\S+) (.*)$", result.stdout, re.MULTILINE))


@pytest.fixture(scope="module")
def semantics(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, str]]:
    """Both ranks' checks of the fault-free scenarios (completion, host blocking points, the comm hook's thread)."""
    results = run_backend_program(tmp_path_factory.mktemp("semantics"), "semantics")
    for rank, result in enumerate(results):
        assert result.returncode == 0 and f"RANK {rank} DONE" in result.stdout, result.stdout
    return [checks(result) for result in results]


def seconds(found: dict[str, str], name: str) -> float:
    return float(found[name])


@pytest.mark.serial  # times the host (< 0.5 s where it must not wait, > DELAY/2 where it must)
def test_wait_returns_at_enqueue_and_is_completed_waits_for_the_collective(semantics):
    rank0 = semantics[0]
    assert seconds(rank0, "wait_seconds") < 0.5, rank0
    assert rank0["future_done"] == "True" and rank0["then_thread"] == "MainThread", rank0
    assert rank0["completed_after_wait"] == "False", rank0


@pytest.mark.serial
def test_the_host_does_not_block_in_an_in_place_update_of_a_pending_tensor_but_at_item(semantics):
    rank0 = semantics[0]
    assert seconds(rank0, "inplace_seconds") < 0.5 and rank0["completed_after_inplace"] == "False", rank0
    assert seconds(rank0, "item_seconds") > DELAY / 2, rank0
    assert float(rank0["item_value"]) == (2 * 3 + 1) * 4 and rank0["completed_after_item"] == "True", rank0


@pytest.mark.serial
def test_an_out_of_place_op_is_queued_and_tolist_blocks(semantics):
    rank0 = semantics[0]
    assert seconds(rank0, "outofplace_seconds") < 0.5, rank0
    assert seconds(rank0, "tolist_seconds") > DELAY / 2 and rank0["tolist_value"] == "[4.0, 4.0]", rank0


@pytest.mark.serial
def test_barrier_and_blocking_wait_block_the_host(semantics):
    rank0 = semantics[0]
    assert seconds(rank0, "barrier_seconds") > DELAY / 2, rank0
    assert seconds(rank0, "blocking_wait_seconds") > DELAY / 2 and rank0["blocking_wait_completed"] == "True", rank0


@pytest.mark.serial
def test_the_host_runs_backward_and_the_optimizer_step_ahead_of_the_all_reduce(semantics):
    rank0, rank1 = semantics
    assert seconds(rank0, "step_seconds") < DELAY / 2 and rank0["step_counter"] == "1", rank0
    assert seconds(rank0, "params_read_seconds") > DELAY / 2, rank0
    assert rank0["params"] == rank1["params"], (rank0, rank1)  # the update used the all-reduced gradients


@pytest.mark.serial  # shares the timed program of the tests above
def test_ddps_comm_hook_runs_on_a_device_thread_while_the_main_thread_waits_in_backward(semantics):
    for found in semantics:
        assert found["hook_threads"] == "ncclorder-device" and found["main_in_backward"] == "True", found


def test_a_lost_peer_completes_the_work_with_an_exception(tmp_path):
    rank0, _ = run_backend_program(tmp_path, "lost-peer")
    found = checks(rank0)
    assert rank0.returncode == 0, rank0.stdout
    assert found["lost_completed"] == "True" and found["lost_exception"] not in (None, "None"), found
    assert found["lost_success"] == "False" and found["lost_get_error"] in ("COMM_ERROR", "TIMEOUT"), found
    assert found["lost_wait_raised"] == found["lost_exception"], found
    assert found["later_exception"] == found["lost_exception"], found  # the communicator is aborted
    # The consumer queued behind the failed collective ran: the device moved on after the abort.
    assert seconds(found, "consumer_after_abort_seconds") < 30, found


def test_fsdp2_and_zero_end_bit_identical_to_gloo(tmp_path):
    """The same jobs (tests/sharded_programs/train_sharded.py's models and data, 4 steps) on both backends, at once.

    Compared shard by shard: every rank's own parameters and buffers."""
    started = {backend: start_backend_program(tmp_path, "train:zero,fsdp", backend) for backend in ("gloo", "ncclorder")}
    shas: dict[str, list[dict[str, str]]] = {}
    for backend, procs in started.items():
        for rank, result in enumerate(finish(procs)):
            assert result.returncode == 0 and f"RANK {rank} DONE" in result.stdout, (backend, result.stdout)
            shas.setdefault(backend, []).append({name: value for name, value in checks(result).items() if name.startswith("sha_")})
    assert all(set(found) == {"sha_zero", "sha_fsdp"} for found in shas["gloo"]), shas
    assert shas["ncclorder"] == shas["gloo"], shas
