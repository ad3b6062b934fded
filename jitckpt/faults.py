"""Fault injection: kill, hang or raise in a chosen rank at a chosen step and phase.

Spec syntax (``jit-run --fault`` or ``JITCKPT_FAULT``), several separated by ``;``::

    rank=2,step=5,phase=backward,kind=kill[,attempt=0]

- ``rank``: global rank that misbehaves.
- ``step``: the minibatch (number of optimizer steps completed before it).
- ``phase``: ``forward``, ``backward``, ``allreduce``, ``optimizer``, ``save``
  (during the just-in-time save, on a healthy rank that is saving) or
  ``snapshot`` (during the memory tier's snapshot at the minibatch's start,
  after the user's save wrote it and before it is committed: ``jitckpt.worker.memory_snapshots``).
- ``kind``: ``kill`` (SIGKILL: the process vanishes), ``hang`` (SIGSTOP: the
  process freezes where the fault is, sockets stay open), ``raise`` (a Python exception),
  ``term`` (SIGTERM to itself: a preemption notice; jitckpt turns it into a
  JIT save of every rank at the next safe point, and the job resumes from it).
- ``attempt``: which torchrun restart the fault fires in (default 0, the first
  run), so a restarted job does not fail at the same place again.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading

from jitckpt import eventlog

PHASES = ("forward", "backward", "allreduce", "optimizer", "save", "snapshot")
KINDS = ("kill", "hang", "raise", "term")


class InjectedFault(RuntimeError):
    """The exception raised by a ``kind=raise`` fault."""


@dataclasses.dataclass(frozen=True)
class FaultSpec:
    rank: int
    step: int
    phase: str
    kind: str
    attempt: int = 0

    def __str__(self) -> str:
        return f"rank={self.rank},step={self.step},phase={self.phase},kind={self.kind},attempt={self.attempt}"


def parse(text: str) -> list[FaultSpec]:
    """Parse a fault spec string; raises ValueError with a message that shows the syntax."""
    specs = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        fields: dict[str, str] = {}
        for item in part.split(","):
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"bad fault spec {part!r}: expected key=value, got {item!r}")
            fields[key.strip()] = value.strip()
        unknown = set(fields) - {"rank", "step", "phase", "kind", "attempt"}
        if unknown:
            raise ValueError(f"bad fault spec {part!r}: unknown key(s) {sorted(unknown)}")
        try:
            spec = FaultSpec(
                rank=int(fields["rank"]),
                step=int(fields["step"]),
                phase=fields["phase"],
                kind=fields["kind"],
                attempt=int(fields.get("attempt", 0)),
            )
        except KeyError as exc:
            raise ValueError(f"bad fault spec {part!r}: missing {exc.args[0]} (syntax: rank=R,step=S,phase=P,kind=K[,attempt=A])") from None
        except ValueError:
            raise ValueError(f"bad fault spec {part!r}: rank, step and attempt must be integers") from None
        if spec.phase not in PHASES:
            raise ValueError(f"bad fault spec {part!r}: phase must be one of {', '.join(PHASES)}")
        if spec.kind not in KINDS:
            raise ValueError(f"bad fault spec {part!r}: kind must be one of {', '.join(KINDS)}")
        specs.append(spec)
    return specs


class FaultInjector:
    """Fires the faults of this rank and attempt when the matching phase is reached."""

    def __init__(self, specs: list[FaultSpec], rank: int, attempt: int) -> None:
        self._armed = [s for s in specs if s.rank == rank and s.attempt == attempt]
        self.phases = {s.phase for s in self._armed}

    def wants(self, phase: str, step: int) -> bool:
        return any(s.phase == phase and s.step == step for s in self._armed)

    def maybe_fire(self, phase: str, step: int) -> None:
        """Carry out the fault armed for (phase, step), if any; each fires once."""
        for spec in list(self._armed):
            if spec.phase == phase and spec.step == step:
                self._armed.remove(spec)
                self.phases = {s.phase for s in self._armed}
                fire(spec)


def fire(spec: FaultSpec) -> None:
    eventlog.record("fault_injected", rank=spec.rank, step=spec.step, phase=spec.phase, kind=spec.kind)
    print(f"[jitckpt] injecting fault {spec}", flush=True)
    if spec.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif spec.kind == "hang":
        # Directed at this thread, so that it stops here.  A SIGSTOP sent to the process is taken by
        # the main thread: another thread that reaches the fault (an autograd device thread running
        # DDP's comm hook) went on until the main thread was scheduled, and on a loaded machine
        # carried out part of the all-reduce it was to hang before (one replica then finished the
        # minibatch, the other did not).  The stop is still the whole process's.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    elif spec.kind == "term":
        os.kill(os.getpid(), signal.SIGTERM)  # the handler records it; the process goes on to the next safe point
    else:
        raise InjectedFault(f"jitckpt injected fault: {spec}")
