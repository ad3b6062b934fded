"""The JIT save's CUDA stream (issue 18, defect 4): never the default stream, which waits behind the hung collective.

No GPU here: a recording stand-in for ``torch.cuda`` shows which stream the
user's save runs on, what that stream waits for, and what is synchronised.
On a GPU this is unverified until ``scripts/gpu-check.sh`` runs on two GPUs.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

import pytest

from jitckpt.worker import save


class FakeCuda:
    """Just what ``jitckpt.worker.save`` uses of ``torch.cuda``, recording every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.current: str = "default"
        self._events = 0
        self._streams = 0

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 1

    def Event(self) -> Any:  # noqa: N802 (torch's name)
        self._events += 1
        cuda, name = self, f"event{self._events}"

        class Event:
            def record(self) -> None:
                cuda.calls.append(("record", (name, cuda.current)))

            def __repr__(self) -> str:
                return name

        return Event()

    def Stream(self) -> Any:  # noqa: N802 (torch's name)
        self._streams += 1
        cuda, name = self, f"side{self._streams}"

        class Stream:
            def wait_event(self, event: Any) -> None:
                cuda.calls.append(("wait_event", (name, repr(event))))

            def synchronize(self) -> None:
                cuda.calls.append(("synchronize", name))

            def __repr__(self) -> str:
                return name

        return Stream()

    @contextlib.contextmanager
    def device(self, index: int) -> Iterator[None]:
        self.calls.append(("device", index))
        yield

    @contextlib.contextmanager
    def stream(self, stream: Any) -> Iterator[None]:
        before, self.current = self.current, repr(stream)
        try:
            yield
        finally:
            self.current = before


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch.cuda", fake)
    monkeypatch.setattr(save, "_start", save._MinibatchStart())
    return fake


def test_the_save_runs_on_a_side_stream_that_waits_only_for_the_minibatch_start(cuda: FakeCuda) -> None:
    save.note_minibatch_start()  # the training thread, after minibatch i-1's optimizer step
    seen: list[str] = []
    with save.off_the_blocked_stream():
        seen.append(cuda.current)  # what the user's save(path) would enqueue on
    assert seen == ["side1"]
    assert cuda.calls == [
        ("record", ("event1", "default")),
        ("device", 1),
        ("wait_event", ("side1", "event1")),
        ("synchronize", "side1"),
    ]
    assert cuda.current == "default"


def test_one_event_is_re_recorded_every_minibatch(cuda: FakeCuda) -> None:
    for _ in range(3):
        save.note_minibatch_start()
    assert [c for c in cuda.calls if c[0] == "record"] == [("record", ("event1", "default"))] * 3


def test_before_the_first_minibatch_ends_the_side_stream_waits_for_nothing(cuda: FakeCuda) -> None:
    with save.off_the_blocked_stream():
        pass
    assert cuda.calls == [("device", 1), ("synchronize", "side1")]


def test_without_cuda_nothing_is_recorded_or_redirected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(save, "_start", save._MinibatchStart())
    save.note_minibatch_start()
    with save.off_the_blocked_stream():
        pass
    assert save._start.event is None


def test_the_runtime_marks_the_start_of_every_minibatch(cuda: FakeCuda) -> None:
    """The end of a minibatch's last optimizer step is where the next one starts: the event is recorded there."""
    from jitckpt.worker.runtime import JitRuntime

    rt = JitRuntime()
    optimizer = object()
    for _ in range(2):
        rt.optimizer_pre_step(optimizer)
        rt.optimizer_post_step(optimizer)
    assert rt.step == 2
    assert [c for c in cuda.calls if c[0] == "record"] == [("record", ("event1", "default"))] * 2
