"""Unit tests: fault-spec parsing and the RNG stash in host shared memory."""

from __future__ import annotations

import os
import pickle
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO
from jitckpt import faults
from jitckpt.worker import rng_state


def test_fault_specs_parse():
    specs = faults.parse("rank=2,step=5,phase=backward,kind=kill; rank=0,step=9,phase=save,kind=hang,attempt=1")
    assert specs == [
        faults.FaultSpec(2, 5, "backward", "kill", 0),
        faults.FaultSpec(0, 9, "save", "hang", 1),
    ]
    assert faults.parse("") == []
    assert faults.parse("rank=1,step=3,phase=optimizer,kind=term") == [faults.FaultSpec(1, 3, "optimizer", "term", 0)]


@pytest.mark.parametrize(
    "text,message",
    [
        ("rank=2,step=5,phase=backwards,kind=kill", "phase must be one of"),
        ("rank=2,step=5,phase=forward,kind=explode", "kind must be one of"),
        ("rank=2,step=5,phase=forward", "missing kind"),
        ("rank=two,step=5,phase=forward,kind=kill", "must be integers"),
        ("rank=2,step=5,phase=forward,kind=kill,when=now", "unknown key"),
        ("rank2,step=5,phase=forward,kind=kill", "expected key=value"),
    ],
)
def test_bad_fault_specs_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        faults.parse(text)


def test_injector_fires_only_for_its_rank_attempt_and_once():
    specs = faults.parse("rank=1,step=3,phase=forward,kind=raise;rank=1,step=3,phase=forward,kind=raise,attempt=1")
    injector = faults.FaultInjector(specs, rank=1, attempt=0)
    assert faults.FaultInjector(specs, rank=0, attempt=0).phases == set()
    injector.maybe_fire("forward", 2)
    injector.maybe_fire("backward", 3)
    with pytest.raises(faults.InjectedFault):
        injector.maybe_fire("forward", 3)
    injector.maybe_fire("forward", 3)  # already fired


_HANG_FROM_A_THREAD = """
import sys, threading
from jitckpt import faults
out = sys.argv[1]

def device_thread():  # as autograd's device thread runs DDP's comm hook, where phase=allreduce fires
    faults.fire(faults.FaultSpec(rank=0, step=0, phase="allreduce", kind="hang"))
    with open(out, "a") as f:  # what the thread does after the fault: issue the collective
        for _ in range(1000):
            f.write("x")
            f.flush()

t = threading.Thread(target=device_thread)
t.start()
t.join()
"""


def _process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


@pytest.mark.parametrize("attempt", range(3))
def test_a_hang_stops_the_thread_that_reaches_it_there(tmp_path, attempt):
    """A ``kind=hang`` fault reached on another thread than the main one stops the process before that thread goes
    on.  A SIGSTOP sent to the process is taken by the main thread; the thread that sent it ran on meanwhile (under
    load: part of the all-reduce it was to hang before, so one replica finished the minibatch and another did
    not).  What the thread does after the fault shows only once the process is continued."""
    out = tmp_path / "after-the-fault"
    out.touch()
    child = subprocess.Popen([sys.executable, "-c", _HANG_FROM_A_THREAD, str(out)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while _process_state(child.pid) != "T":
            assert child.poll() is None and time.monotonic() < deadline, "the process never stopped"
            time.sleep(0.01)
        time.sleep(0.2)
        assert out.read_text() == "", "the thread went on after the fault before the process stopped"
        os.kill(child.pid, signal.SIGCONT)
        assert child.wait(60) == 0
        assert out.read_text() == "x" * 1000  # continued: it goes on from the fault
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_rng_capture_restore_reproduces_random_streams():
    torch.manual_seed(7)
    random.seed(7)
    state = rng_state.capture()
    first = (torch.rand(5), random.random())
    rng_state.restore(bytes(state))
    second = (torch.rand(5), random.random())
    assert torch.equal(first[0], second[0]) and first[1] == second[1]


def test_rng_capture_follows_every_generator_between_captures():
    """Each capture reflects draws made since the previous one (torch, Python random, NumPy)."""
    import numpy

    torch.manual_seed(3)
    random.seed(3)
    numpy.random.seed(3)
    rng_state.capture()
    torch.rand(2), random.random(), numpy.random.rand(2), numpy.random.normal()  # noqa: B018
    state = rng_state.capture()
    expected = (torch.rand(4), random.random(), numpy.random.rand(3), numpy.random.normal())
    torch.rand(9), random.random(), numpy.random.rand(9)  # noqa: B018  (move every stream on)
    rng_state.restore(state)
    again = (torch.rand(4), random.random(), numpy.random.rand(3), numpy.random.normal())
    assert torch.equal(expected[0], again[0])
    assert expected[1] == again[1]
    assert (expected[2] == again[2]).all() and expected[3] == again[3]


def test_rng_capture_sees_a_consumed_cached_gaussian():
    """NumPy's legacy normal() caches a second value; using it changes the state without moving the MT words."""
    import numpy

    numpy.random.seed(5)
    numpy.random.normal()  # draws two, caches one
    rng_state.capture()
    numpy.random.normal()  # consumes the cached one: the raw words do not move
    state = rng_state.capture()
    expected = numpy.random.normal(size=3)
    numpy.random.normal()
    rng_state.restore(state)
    assert (numpy.random.normal(size=3) == expected).all()


def test_rng_stash_keeps_three_steps_and_survives_the_writer(tmp_path):
    stash = rng_state.RngStash(tmp_path, rank=3)
    for step in range(5):
        torch.manual_seed(step)
        stash.put(step, rng_state.capture())
    del stash  # the rank "dies": the file stays
    slots = rng_state.read_stash(rng_state.stash_path(tmp_path, 3))
    assert sorted(slots) == [2, 3, 4]  # (a survivor may save i-1 while a rank on its host stashed i+1)
    torch.manual_seed(4)
    expected = torch.rand(3)
    rng_state.restore(slots[4])
    assert torch.equal(torch.rand(3), expected)


class _Planted:
    """What an attacker would put into a checkpoint: a pickle that runs code when loaded."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.marker, "w"))


def test_restoring_never_executes_what_it_reads(tmp_path):
    marker = tmp_path / "planted-code-ran"
    planted = pickle.dumps({"torch_cpu": _Planted(str(marker))})
    before = torch.get_rng_state()
    with pytest.raises(rng_state.RngStateError, match="not a jitckpt RNG state"):
        rng_state.restore(planted)
    assert not marker.exists(), "restoring an RNG state ran code from the file"
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("damage", ["truncate", "unknown-kind", "short-python", "no-cpu"])
def test_malformed_rng_states_are_refused_and_change_nothing(damage):
    good = rng_state.capture()
    magic = len(rng_state.MAGIC)
    if damage == "truncate":
        bad = good[:-7]
    elif damage == "unknown-kind":
        bad = good + bytes([9]) + (0).to_bytes(4, "little")
    elif damage == "short-python":
        bad = rng_state.MAGIC + bytes([rng_state.PYTHON]) + (8).to_bytes(4, "little") + b"\0" * 8
    else:
        kind, length = good[magic], int.from_bytes(good[magic + 1:magic + 5], "little")
        assert kind == rng_state.TORCH_CPU
        bad = rng_state.MAGIC + good[magic + 5 + length:]
    random.seed(11)
    before = (torch.get_rng_state(), random.getstate())
    with pytest.raises(rng_state.RngStateError):
        rng_state.restore(bad)
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]


def test_torn_stash_slot_is_ignored(tmp_path):
    stash = rng_state.RngStash(tmp_path, rank=0)
    stash.put(6, rng_state.capture())
    stash.put(7, rng_state.capture())
    path = rng_state.stash_path(tmp_path, 0)
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # corrupt slot 0 (step 6) payload
    path.write_bytes(bytes(data))
    assert sorted(rng_state.read_stash(path)) == [7]


def test_module_buffers_rewind_to_the_start_of_the_minibatch():
    """BatchNorm statistics updated by a minibatch's forward passes are put back for a save of its start."""
    from jitckpt.worker.module_buffers import BufferSnapshots

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    snapshots = BufferSnapshots()
    snapshots.note_module(model)
    snapshots.take(0)
    model(torch.randn(8, 4))
    snapshots.take(1)  # start of minibatch 1
    start = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.randn(8, 4))
    snapshots.take(1)  # a second forward (gradient accumulation) of the same minibatch: no new copy
    model(torch.randn(8, 4))
    assert not torch.equal(model[1].running_mean, start["1.running_mean"])
    assert not snapshots.rewind(0), "only the start of the current minibatch is held"
    assert snapshots.rewind(1)
    for key, value in model.state_dict().items():
        assert torch.equal(value, start[key]), key


_OWN_GENERATORS = r'''
import random, struct, tempfile
import numpy, torch
from jitckpt.worker import private_rng, rng_state

assert private_rng.install() == [], "torch.Generator cannot be tracked by this torch"
tempfile.NamedTemporaryFile().close()                 # the standard library's own Random: not tracked
def make():                                           # two torch generators made at one place: told apart by rank
    return torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
g1, g2 = make()
r = random.Random(3)
n = numpy.random.default_rng(4)
transient = torch.Generator()                         # dies before the capture: not in it
del transient
names = [(entry.kind, entry.name, rank) for entry, rank, _ in private_rng._registry.live_entries()]
assert [n[0] for n in names] == [1, 1, 2, 3], names
assert names[0][1] == names[1][1] and (names[0][2], names[1][2]) == (0, 1), names
assert not any("tempfile" in n[1] for n in names), names
state = rng_state.capture()
draws = lambda: (torch.rand(2, generator=g1).tolist(), torch.rand(2, generator=g2).tolist(), r.random(), n.random())
expected = draws()
draws(); draws()
rng_state.restore(state)
assert draws() == expected, "the script's own generators did not come back"

# untrusted input: a malformed record of them is refused as a whole, numbers only
records = rng_state.decode(state)
private = records[rng_state.PRIVATE][0]
head = state[:len(state) - len(private) - 5]
for bad in (private[:-3], private + b"x", struct.pack("<H", 1) + bytes([9]) + private[3:]):
    try:
        rng_state.restore(head + struct.pack("<BI", rng_state.PRIVATE, len(bad)) + bad)
    except rng_state.RngStateError as exc:
        print("refused:", exc)
    else:
        raise AssertionError("a malformed record was accepted")

# a generator the failed run had that this process has not made (yet): a warning, the rest put back
del g2
rng_state.restore(state)
private_rng.warn_absent()
assert torch.rand(2, generator=g1).tolist() == expected[0]

# a generator made per epoch: the failed run's capture holds the last epoch's, which must not overwrite
# a new one seeded for the next epoch; one made again with the same seed is the same generator
def per_epoch(epoch):
    return torch.Generator().manual_seed(100 + epoch), random.Random(100 + epoch), numpy.random.default_rng(100 + epoch)
gens = per_epoch(0)
gens[1].random(), gens[2].random()
torch.rand(3, generator=gens[0])
state = rng_state.capture()
after = [torch.rand(2, generator=gens[0]).tolist(), gens[1].random(), gens[2].random()]
del gens
fresh = [torch.rand(2, generator=torch.Generator().manual_seed(101)).tolist(), random.Random(101).random(),
         numpy.random.default_rng(101).random()]
gens = per_epoch(1)
rng_state.restore(state)
assert [torch.rand(2, generator=gens[0]).tolist(), gens[1].random(), gens[2].random()] == fresh, "a new epoch's generator was overwritten"
del gens
gens = per_epoch(0)
rng_state.restore(state)
assert [torch.rand(2, generator=gens[0]).tolist(), gens[1].random(), gens[2].random()] == after, \
    "the same epoch's generator made again was not put back"
print("ok")
'''


def test_the_scripts_own_generators_are_captured_named_and_put_back():
    """torch.Generator, random.Random and numpy.random.default_rng objects the script makes ride in the
    RNG state (jitckpt.worker.private_rng), each named by where it was made, put back only into a generator
    with the same seed (not over a new epoch's); a damaged record is refused."""
    proc = subprocess.run([sys.executable, "-c", _OWN_GENERATORS], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("refused:") == 3 and proc.stdout.rstrip().endswith("ok"), proc.stdout
    assert "does not exist when the redone minibatch starts" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
