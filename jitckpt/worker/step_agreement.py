"""Every rank resumes from the same checkpoint step: an agreement through the job's torchrun store.

Why.  Each rank selects the checkpoint it loads on its own
(``jitckpt.store.select``), from its own listing of the checkpoint root.  On
a shared file system with client-side caching (NFS directory and attribute
caches, ...) ranks can see different listings, and a rank whose cache has not
seen the newest step yet would silently resume at an older minibatch than its
peers: the job trains on with ranks at different minibatches, a wrong answer
that nothing reports.

How.  After its selection every rank publishes the step it selected (or that
it found none, or the error that stopped it) under its own key in the job's
store.  Rank 0 waits for every rank's key and publishes a verdict, the one key
the other ranks wait for and read (so the store's traffic grows with the
number of ranks, not with its square).

- All agree: nothing changes (one store round trip).
- They disagree: every rank adopts the newest step that every rank could
  select, the minimum of the choices; if a rank found nothing, every rank
  starts afresh.  A rank that had selected a newer step selects again at
  exactly the agreed step (``select(step=...)``).  The ranks then publish
  whether that worked and wait for each other once more, so that if one rank
  cannot load the agreed step all of them stop with a ``CheckpointError``
  naming the step, the rank and the cause, instead of its peers training on
  into a hang.  The disagreement is printed on every rank and recorded in the
  event log (``step_agreement``).

Which store.  The default process group's store if the group exists (the usual
case: the script calls ``jit_get_checkpoint_path()`` after
``init_process_group``, and DDP's construction needs the group anyway).
Before the group exists, torchrun's: a client of the agent's store when the
workers share it (``TORCHELASTIC_USE_AGENT_STORE=True``); otherwise (jit-run's
default, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) the store that rank 0 hosts
at ``MASTER_ADDR:MASTER_PORT`` for ``init_process_group`` anyway: rank 0
starts that server now, multi-tenant, and keeps it, so that
``init_process_group`` later reuses it rather than finding the port taken.
With one rank, or outside torchrun (no ``MASTER_ADDR``/``MASTER_PORT``),
there is nobody to agree with and nothing is done.

Keys.  ``jitckpt/step-agreement/<generation>/choice/<rank>`` and
``.../outcome/<rank>``, rank 0's verdicts ``.../choice/verdict`` and
``.../outcome/verdict``, where the generation is the rendezvous round
(``JITCKPT_RENDEZVOUS_ROUND``), else the attempt, exactly as
``instrument._give_each_attempt_its_own_store`` names its namespace: the
agent's store outlives a restart, and a restarted attempt must never read the
choices of the attempt that died.

Timeout.  Rank 0 waits at most ``JITCKPT_AGREEMENT_TIMEOUT`` seconds (default
300: long enough for the slowest peer to checksum its checkpoint) for every
rank's key, the others as long for rank 0's own key and then a little longer
for its verdict; then every rank raises a ``CheckpointError`` naming the ranks
that never published: a clear error, not a hang.

Once per process.  ``resume.locate`` may select twice in one process (a DDP
module built before the optimizer: the second look knows the rank's shard
identity).  Whether and when a rank looks twice depends on the order in which
its script builds DDP and its optimizers, so a second store round could wait
for peers that never look again.  Only the first selection of a process is
therefore agreed; every later one is pinned to the agreed step
(``select(step=agreed)``) and talks to nobody.  A later look is only ever
stricter than the first (it also checks the shard key), so it either finds
the agreed step again or this rank raises a ``CheckpointError`` naming the
step, the rank and the cause; its peers, already settled, then stop at their
first collective with it, through jitckpt's usual failure handling.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
import weakref
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable

from jitckpt import config, eventlog
from jitckpt.store import CheckpointError, CheckpointInfo, CheckpointWarning
from jitckpt.store.shard import format_ranks
from jitckpt.worker.console import log

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

# Every key lives under this prefix, then the generation (see the module docstring).
KEY_PREFIX = "jitckpt/step-agreement"
# what each rank selected: {"step": int | None, "error": str | None, "why": str | None (why it chose a step older
# than the newest it could load: resume.locate)}
CHOICE = "choice"
OUTCOME = "outcome"  # after a disagreement: whether each rank could load the agreed step: {"error": str | None}
VERDICT = "verdict"  # rank 0's summary of a round, the only key every rank reads
LEADER = 0  # the rank that reads every rank's key and publishes the verdict
# How much longer than the timeout a rank waits for the leader's verdict once the
# leader has published its own key (the leader itself waits at most the timeout).
VERDICT_MARGIN_S = 30.0
TORCHRUN_SHARES_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"

# A selection: given an exact step (or None: the newest it can load), this rank's checkpoint or None.
Chooser = Callable[[int | None], CheckpointInfo | None]


@dataclasses.dataclass
class _Settled:
    """What the first selection of a process settled on."""

    agreed: bool  # False: no agreement took place (one rank, or not under torchrun)
    step: int | None  # the agreed step; None: a fresh start
    overruled_to_fresh_start: bool = False  # this rank had a checkpoint, but a peer found none


# Per runtime (one per worker process; tests may build several).
_settled: "weakref.WeakKeyDictionary[JitRuntime, _Settled]" = weakref.WeakKeyDictionary()
# Stores this process opened itself: kept open for the life of the process (rank 0's
# may be the server its peers and init_process_group use).
_opened: list[Any] = []


def agreed_selection(rt: "JitRuntime", choose: Chooser,
                     why_older: Callable[[], str | None] = lambda: None) -> CheckpointInfo | None:
    """This rank's checkpoint, at the step every rank of the job resumes from (see the module docstring).

    ``choose(None)`` is this rank's own selection, ``choose(step)`` one at
    exactly ``step``.  CheckpointWarnings it raises reach the caller as usual.
    ``why_older()``, after ``choose(None)``: why this rank chose a step older
    than the newest it could load (None: it did not), told to every rank.
    """
    settled = _settled.get(rt)
    if settled is not None:  # a later look of this process: never a second store round
        if not settled.agreed:
            return choose(None)
        return None if settled.step is None else _at_agreed_step(rt, settled.step, choose)

    store = None
    if rt.world_size > 1:
        timeout = config.env_float(config.ENV_AGREEMENT_TIMEOUT, config.DEFAULT_AGREEMENT_TIMEOUT)
        store = job_store(rt, timeout)
    if store is None:
        _settled[rt] = _Settled(agreed=False, step=None)
        return choose(None)
    exchange = _Exchange(store, rt, f"{KEY_PREFIX}/{generation(rt)}", timeout)

    try:
        mine = choose(None)
    except Exception as exc:  # tell the peers at once rather than let them wait out the timeout
        exchange.publish(CHOICE, {"step": None, "error": f"{type(exc).__name__}: {exc}"})
        raise
    mine_step = None if mine is None else mine.step
    verdict = exchange.round(CHOICE, {"step": mine_step, "error": None, "why": why_older()}, "checkpoint choice",
                             _decide_step)
    if verdict["failed"]:
        raise CheckpointError(_failure(verdict["failed"], "could not select a checkpoint") +
                              f"; rank {rt.rank} stops too, before loading anything")
    agreed, choices = verdict["agreed"], verdict["choices"]
    if len(choices) == 1:  # unanimous: nothing changes
        _settled[rt] = _Settled(agreed=True, step=mine_step)
        return mine

    _report_disagreement(rt, choices, mine_step, agreed, verdict.get("why"))
    _settled[rt] = _Settled(agreed=True, step=agreed, overruled_to_fresh_start=agreed is None and mine is not None)
    if agreed is None:
        eventlog.record("step_agreement", rank=rt.rank, attempt=rt.attempt, selected=mine_step, agreed=None,
                        loaded=True, choices=choices)
        return None
    problem = None
    info = mine
    if mine_step != agreed:
        try:
            info = _at_agreed_step(rt, agreed, choose)
        except CheckpointError as exc:
            problem = exc
    verdict = exchange.round(OUTCOME, {"error": None if problem is None else str(problem)},
                             "report on loading the agreed step", _decide_outcome)
    eventlog.record("step_agreement", rank=rt.rank, attempt=rt.attempt, selected=mine_step, agreed=agreed,
                    loaded=problem is None, choices=choices)
    if problem is not None:
        raise problem
    if verdict["failed"]:  # its message names the step, the rank and the cause
        raise CheckpointError(_failure(verdict["failed"], "") + f"; rank {rt.rank} stops too, before loading anything")
    return info


def overruled_to_fresh_start(rt: "JitRuntime") -> bool:
    """True if this rank found a checkpoint but starts afresh because a peer found none."""
    settled = _settled.get(rt)
    return settled is not None and settled.overruled_to_fresh_start


class _Exchange:
    """Store rounds of one attempt: every rank publishes its key, the leader reads them all and
    publishes a verdict, every other rank reads only the verdict (O(world size) store traffic)."""

    def __init__(self, store: Any, rt: "JitRuntime", prefix: str, timeout: float) -> None:
        self.store, self.rt, self.prefix, self.timeout = store, rt, prefix, timeout

    def key(self, name: str, who: int | str) -> str:
        return f"{self.prefix}/{name}/{who}"

    def publish(self, name: str, value: dict, who: int | str | None = None) -> None:
        self.store.set(self.key(name, self.rt.rank if who is None else who), json.dumps(value))

    def round(self, name: str, value: dict, what: str, decide: Callable[[dict[int, dict]], dict]) -> dict:
        """Publish ``value``; return the verdict ``decide`` made of every rank's value, on the leader.

        A CheckpointError names the ranks that did not publish in time.
        """
        rt = self.rt
        self.publish(name, value)
        if rt.rank == LEADER:
            keys = [self.key(name, rank) for rank in range(rt.world_size)]
            missing = self._wait(keys, self.timeout)
            if missing:
                verdict = {"missing": format_ranks(missing), "count": len(missing)}
            else:
                values = self.store.multi_get(keys)
                verdict = decide({rank: json.loads(bytes(v).decode()) for rank, v in enumerate(values)})
            self.publish(name, verdict, VERDICT)
        else:  # the leader's own key first (it is alive and done choosing), then its verdict
            if self._wait([self.key(name, LEADER)], self.timeout):
                verdict = {"missing": str(LEADER), "count": 1}
            elif (leader := self._read(self.key(name, LEADER))).get("error"):
                verdict = {"failed": _failures({LEADER: leader["error"]})}  # it stops without a verdict
            elif self._wait([self.key(name, VERDICT)], self.timeout + VERDICT_MARGIN_S):
                raise CheckpointError(f"rank {rt.rank}: rank {LEADER} published its {what} but no verdict on every "
                                      f"rank's within {self.timeout + VERDICT_MARGIN_S:g} s (it died?); nothing was loaded")
            else:
                verdict = self._read(self.key(name, VERDICT))
        if verdict.get("missing"):
            one = verdict["count"] == 1
            who = f"rank {verdict['missing']} did not publish its" if one else f"ranks {verdict['missing']} did not publish their"
            why = "crashed or is stuck" if one else "crashed or are stuck"
            if name == CHOICE:
                why += (" before selecting a checkpoint, or never calls" if one else
                        " before selecting a checkpoint, or never call") + " jit_get_checkpoint_path() (every rank must)"
            raise CheckpointError(f"rank {rt.rank} stops: {who} {what} within {self.timeout:g} s "
                                  f"({config.ENV_AGREEMENT_TIMEOUT}): {'it' if one else 'they'} {why}; nothing was loaded")
        return verdict

    def _read(self, key: str) -> dict:
        return json.loads(bytes(self.store.get(key)).decode())

    def _wait(self, keys: list[str], timeout: float) -> list[int]:
        """Wait for ``keys``; the indices of those still missing after ``timeout`` seconds."""
        try:
            self.store.wait(keys, timedelta(seconds=timeout))
            return []
        except RuntimeError:  # DistStoreError: timed out (or the store went away)
            try:
                return [i for i, key in enumerate(keys) if not self.store.check([key])]
            except RuntimeError as exc:
                raise CheckpointError(f"rank {self.rt.rank} lost the job's store while agreeing on the checkpoint "
                                      f"step ({type(exc).__name__}: {exc}); nothing was loaded") from None


def _decide_step(choices: dict[int, dict]) -> dict:
    """The leader's verdict on every rank's choice: the failures, the choices by step, the agreed step."""
    failed = {rank: c["error"] for rank, c in choices.items() if c.get("error")}
    steps = {rank: c.get("step") for rank, c in choices.items()}
    agreed = None if None in steps.values() else min(steps.values())  # type: ignore[type-var]
    # why the rank that chose the agreed step held back (the lowest such rank's words)
    why = next((c["why"] for rank, c in sorted(choices.items()) if c.get("why") and steps[rank] == agreed), None)
    return {"failed": _failures(failed), "agreed": agreed, "choices": _by_step(steps), "why": why}


def _decide_outcome(outcomes: dict[int, dict]) -> dict:
    """The leader's verdict on whether every rank could load the agreed step."""
    return {"failed": _failures({rank: o["error"] for rank, o in outcomes.items() if o.get("error")})}


def _failures(failed: dict[int, str]) -> dict | None:
    """The ranks that failed, and the lowest one's error (every rank's would not scale)."""
    if not failed:
        return None
    rank = min(failed)
    return {"ranks": format_ranks(sorted(failed)), "count": len(failed), "rank": rank, "error": failed[rank]}


def _failure(failed: dict, what: str) -> str:
    """In words: ``rank R what: error``; the error alone where it names its rank already (``what`` empty)."""
    if not what:
        return failed["error"] + (f" (ranks {failed['ranks']} cannot load it)" if failed["count"] > 1 else "")
    if failed["count"] == 1:
        return f"rank {failed['rank']} {what}: {failed['error']}"
    return f"ranks {failed['ranks']} {what} (rank {failed['rank']}: {failed['error']})"


def _at_agreed_step(rt: "JitRuntime", step: int, choose: Chooser) -> CheckpointInfo:
    """This rank's checkpoint of exactly ``step``, or a CheckpointError naming the step, the rank and the cause."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointWarning)
        info = choose(step)
    for warning in caught:  # still the caller's to print
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if info is not None:
        return info
    reasons = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
    if not reasons:
        reasons = [f"minibatch {step} is not in this rank's listing of {rt.checkpoint_root}"]
    raise CheckpointError(
        f"rank {rt.rank} cannot load the agreed checkpoint of minibatch {step} (the newest step every rank "
        f"selected): {'; '.join(reasons)}"
    )


def _report_disagreement(rt: "JitRuntime", choices: list[list], mine: int | None, agreed: int | None,
                         why: str | None = None) -> None:
    """One line on every rank: who chose what, why (a rank's own reason, else the listings), what every rank does."""
    table = "; ".join(f"{'none' if step is None else f'minibatch {step}'} on rank {ranks}" for step, ranks in choices)
    if agreed is None:
        nobody = next(ranks for step, ranks in choices if step is None)
        outcome = f"rank {nobody} found no checkpoint, so every rank starts afresh from minibatch 0"
    else:
        outcome = f"every rank resumes from minibatch {agreed}, the newest step all of them selected"
    if mine != agreed:
        outcome += f" (this rank had selected {'none' if mine is None else f'minibatch {mine}'})"
    cause = why or f"their listings of {rt.checkpoint_root} differ, e.g. a stale file-system cache"
    log(f"the ranks selected different checkpoints ({table}): {cause}; {outcome}")


def _by_step(steps: dict[int, int | None]) -> list[list]:
    """``[step, ranks]`` pairs, the ranks that chose each step written compactly, newest first, "none" last."""
    order = sorted(set(steps.values()), key=lambda s: (s is None, -(s or 0)))
    return [[step, format_ranks(sorted(r for r, s in steps.items() if s == step))] for step in order]


def generation(rt: "JitRuntime") -> str:
    """This attempt's namespace: the one instrument._give_each_attempt_its_own_store gives the rendezvous store."""
    round_ = os.environ.get(config.ENV_RENDEZVOUS_ROUND)
    return f"round-{round_}" if round_ else f"attempt-{rt.attempt}"


def job_store(rt: "JitRuntime", timeout: float) -> Any:
    """The store all ranks of this attempt share (see the module docstring), or None outside torchrun."""
    import torch.distributed as dist

    if not dist.is_available():
        return None
    if dist.is_initialized():
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    agent_hosts_it = os.environ.get(TORCHRUN_SHARES_AGENT_STORE) == str(True)
    try:
        store = dist.TCPStore(host, int(port), is_master=not agent_hosts_it and rt.rank == 0,
                              timeout=timedelta(seconds=timeout), wait_for_workers=False, multi_tenant=True)
    except (RuntimeError, ValueError) as exc:
        raise CheckpointError(
            f"rank {rt.rank} cannot reach the job's store at {host}:{port} to agree with the other ranks on the "
            f"checkpoint step ({type(exc).__name__}: {exc}); nothing was loaded"
        ) from None
    _opened.append(store)
    return store
