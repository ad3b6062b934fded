"""`jit-run [options] torchrun ...`: supervise a torchrun job with just-in-time checkpointing.

jit-run checks its inputs before anything starts (an unwritable checkpoint
directory is an error now, not at failure time), then runs torchrun's own
agent with the jit-run patches (``jitckpt.launch.agent``) and the workers'
environment set up.  torchrun's flags pass through unchanged; restarts are
``--max-restarts``.  When torchrun exits, jit-run prints the recovery report
and writes it as JSON.  ``--transparent`` hands the job to
``jitckpt.launch.transparent`` instead (transparent mode: one device proxy per rank).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from jitckpt import config, eventlog, faults, native
from jitckpt.console import emit
from jitckpt.launch import report
from jitckpt.launch.child import wait_forwarding_signals
from jitckpt.store import CheckpointError, DiskStore, check_writable, is_complete
from jitckpt.store.memory import MemoryStore, keep_on_disk, parity_area, peer_copies
from jitckpt.store.private import make_private_dir
from jitckpt.validate import argparse_type, positive_number


class UsageError(Exception):
    """Bad jit-run input: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="jit-run",
        description="Run a torchrun job with just-in-time checkpointing: on a failure the healthy "
        "replicas save, torchrun restarts the job, and at most one minibatch is redone.",
        epilog="Subcommands: `jit-run plan --help` (failure-cost model). "
        "Every option can also be set by the environment variable shown. "
        f"Exit status: torchrun's (0 when the job completed); {config.JOB_STOPPED_EXIT_CODE} when jit-run stopped "
        "the job because resuming would not have repeated the fault-free run (see --allow-inexact-resume); "
        "2 for bad input.",
    )
    parser.add_argument("--checkpoint-dir", default=env(config.ENV_CHECKPOINT_DIR),
                        help=f"where JIT checkpoints go [{config.ENV_CHECKPOINT_DIR}, default "
                             f"{config.DEFAULT_CHECKPOINT_DIR}/JOB: JOB is the scheduler's job id (Slurm, PBS, LSF, "
                             f"Kubernetes job name), so a requeued job resumes, else a digest of the command line, "
                             f"so rerunning the same command resumes and another job never reads these checkpoints]")
    parser.add_argument("--hang-timeout", type=argparse_type(positive_number),
                        default=env(config.ENV_HANG_TIMEOUT, str(config.DEFAULT_HANG_TIMEOUT)),
                        help=f"seconds a collective may stay in flight before it counts as hung "
                             f"[{config.ENV_HANG_TIMEOUT}, default %(default)s]")
    parser.add_argument("--save-grace", type=argparse_type(positive_number),
                        default=env(config.ENV_SAVE_GRACE, str(config.DEFAULT_SAVE_GRACE)),
                        help=f"seconds healthy ranks get to finish their save before torchrun's teardown kills them, on every "
                             f"teardown path (replaces torchrun's --shutdown-timeout; a frozen worker is killed at once) "
                             f"[{config.ENV_SAVE_GRACE}, default %(default)s]")
    parser.add_argument("--report", default=env(config.ENV_REPORT),
                        help=f"where to write the JSON recovery report [{config.ENV_REPORT}, "
                             f"default CHECKPOINT_DIR/jitckpt-report.json]")
    parser.add_argument("--fault", default=env(config.ENV_FAULT, ""),
                        help="inject a fault, e.g. rank=2,step=5,phase=backward,kind=kill "
                             f"(phases: {', '.join(faults.PHASES)}; kinds: {', '.join(faults.KINDS)}) [{config.ENV_FAULT}]")
    parser.add_argument("--emulated-gpus", type=int, metavar="N",
                        help="run the job's CUDA programs on N CPU-emulated GPUs per node (the CPU device emulator; "
                             "in transparent mode the proxies load it too)")
    parser.add_argument("--interpose", choices=("auto", "on", "off"), default=env(config.ENV_INTERPOSE, "auto"),
                        help="preload the CUDA/NCCL interposition library (C watchdog over NCCL events) into the "
                             f"workers: auto = when the host has NVIDIA GPUs or --emulated-gpus is given "
                             f"[{config.ENV_INTERPOSE}, default %(default)s]")
    parser.add_argument("--warm-restart", choices=("on", "off"),
                        default=env(config.ENV_WARM_RESTART, config.DEFAULT_WARM_RESTART),
                        help="on: fork every worker of every (re)start from one template interpreter per node that "
                             "has already imported torch (workers skip Python start-up and `import torch`); off: "
                             f"torchrun spawns fresh interpreters [{config.ENV_WARM_RESTART}, default %(default)s]")
    parser.add_argument("--memory-tier", choices=config.MEMORY_TIER_MODES,
                        default=env(config.ENV_MEMORY_TIER, config.DEFAULT_MEMORY_TIER),
                        help="snapshot every rank's shard into host memory at the start of every minibatch, so that "
                             "a lost rank whose state has no copy on another rank (FSDP2, ZeroRedundancyOptimizer) "
                             "resumes with at most one minibatch redone: auto = when some rank's state has no copy, "
                             "on = always, off = never (a lost shard then means the newest checkpoint that covers "
                             f"every shard) [{config.ENV_MEMORY_TIER}, default %(default)s]")
    parser.add_argument("--memory-redundancy", choices=config.MEMORY_REDUNDANCY_SCHEMES,
                        default=env(config.ENV_MEMORY_REDUNDANCY, config.DEFAULT_MEMORY_REDUNDANCY),
                        help="multi-node jobs: how the memory tier survives a lost host: replicate = a copy of every "
                             f"snapshot in the memory of the next node ({config.ENV_MEMORY_COPIES} copies on the next "
                             "nodes, default 1), xor = one XOR parity per "
                             f"group of nodes ({config.ENV_MEMORY_GROUP} nodes, default all but one, at most 8), "
                             "kept on a node outside the group, rebuilt from the others at a restart; rs = "
                             f"{config.ENV_MEMORY_PARITIES} (default 2) Reed-Solomon parities per group, each on "
                             "another node, any that many lost hosts rebuilt (needs ISA-L: pip install 'jitckpt[rs]') "
                             f"[{config.ENV_MEMORY_REDUNDANCY}, default %(default)s]")
    parser.add_argument("--allow-inexact-resume", action="store_true",
                        default=env(config.ENV_ALLOW_INEXACT_RESUME, "") == "1",
                        help="go on when a rank's own per-rank state for the resumed minibatch cannot be found (its "
                             "data loader's position and seeds, lost with its host); the run is then not bit-exact "
                             "and the report's outcome says so. Without it the job stops with the reason "
                             f"[{config.ENV_ALLOW_INEXACT_RESUME}=1]")
    parser.add_argument("--keep", type=int, default=3,
                        help="keep the newest N complete checkpoint steps, prune older ones at start (default %(default)s)")
    parser.add_argument("--transparent", action="store_true",
                        help="transparent mode: the program runs unchanged and every CUDA runtime and NCCL call goes "
                             "to a device proxy per rank (jitckpt-proxy); checked by `jit-run doctor` first, refused "
                             "with the reasons when it cannot work. `torchrun ... --no-python ./program` or "
                             "`torchrun ... train.py`; a bare `./program` runs as one rank")
    parser.add_argument("--proxy-cudart", metavar="PATH",
                        help="transparent mode: the CUDA runtime the proxies load (their --cudart; default: the "
                             "libcudart.so.13 the program itself would load, found as the dynamic loader finds it; "
                             "the CPU device emulator's only with --emulated-gpus)")
    parser.add_argument("--proxy-nccl", metavar="PATH",
                        help="transparent mode: the NCCL the proxies load (their --nccl; default: the libnccl.so.2 "
                             "the program itself would load)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="torchrun [torchrun options] script.py [args]")
    return parser


def split_torchrun(command: list[str]) -> list[str]:
    """The torchrun arguments of ``command``; raises UsageError if it is not a torchrun command."""
    if command and Path(command[0]).name == "torchrun":
        return command[1:]
    if len(command) >= 3 and Path(command[0]).name.startswith("python") and command[1:3] == ["-m", "torch.distributed.run"]:
        return command[3:]
    shown = " ".join(command[:3]) or "nothing"
    raise UsageError(
        f"jit-run runs torchrun jobs: `jit-run [options] torchrun --nproc_per_node N train.py ...` (got {shown!r})"
    )


def max_restarts(torchrun_args: list[str]) -> int:
    """torchrun's --max-restarts value (0, torchrun's default, when absent or unparsable)."""
    for i, arg in enumerate(torchrun_args):
        name, sep, value = arg.partition("=")
        if name in ("--max-restarts", "--max_restarts"):
            value = value if sep else (torchrun_args[i + 1] if i + 1 < len(torchrun_args) else "")
            return int(value) if value.isdigit() else 0
    return 0


# Scheduler variables that name a job; the same value after a requeue.
JOB_ID_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "KUBERNETES_JOB_NAME")
# torchrun options whose value differs between the nodes of one job: left out of the digest.
PER_NODE_OPTIONS = ("--node-rank", "--node_rank", "--local-addr", "--local_addr")


def default_checkpoint_dir(command: list[str], environ: dict[str, str] | None = None) -> Path:
    """The checkpoint directory when none is given: one per job, so two jobs never read each other's.

    A job is named by its scheduler's job id if there is one (a requeued job
    keeps it, and resumes), else by torchrun's ``--rdzv-id`` (the same on every
    node), else by a digest of its command line, without the options that
    differ between nodes, and working directory (rerunning the same command
    resumes; another command starts afresh).
    """
    environ = os.environ if environ is None else environ

    def named(kind: str, value: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in value)[:64]
        return Path(config.DEFAULT_CHECKPOINT_DIR) / f"{kind}-{safe}"

    for name in JOB_ID_VARIABLES:
        value = environ.get(name, "")
        if value and value != "none":
            return named(name.split("_")[0].lower(), value)
    kept: list[str] = []
    skip = False
    for i, arg in enumerate(command):
        option, sep, value = arg.partition("=")
        if option in ("--rdzv-id", "--rdzv_id"):
            value = value if sep else (command[i + 1] if i + 1 < len(command) else "")
            if value and value != "none":
                return named("rdzv", value)
        if skip:
            skip = False
        elif option in PER_NODE_OPTIONS:
            skip = not sep
        else:
            kept.append(arg)
    digest = hashlib.sha256("\0".join([os.getcwd(), *kept]).encode()).hexdigest()[:12]
    script = next((Path(a).stem for a in command[1:] if a.endswith(".py")), "job")
    return Path(config.DEFAULT_CHECKPOINT_DIR) / f"{script}-{digest}"


def prepare(args: argparse.Namespace) -> tuple[list[str], dict[str, str], Path]:
    """Validate everything and build the agent command line and environment."""
    if not args.command:
        raise UsageError("no command given: `jit-run [options] torchrun --nproc_per_node N train.py ...`")
    torchrun_args = split_torchrun(args.command)
    if not torchrun_args:
        raise UsageError("torchrun needs a training script: `jit-run torchrun --nproc_per_node N train.py`")
    if importlib.util.find_spec("torch") is None:
        raise UsageError(f"PyTorch is not installed for {sys.executable}; install it (scripts/setup.sh does) and retry")
    try:
        faults.parse(args.fault)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.keep < 1:
        raise UsageError("--keep must be at least 1")
    try:  # read by the workers; nonsense is refused here, before any worker starts
        config.env_float(config.ENV_AGREEMENT_TIMEOUT, config.DEFAULT_AGREEMENT_TIMEOUT)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.warm_restart not in ("on", "off"):
        raise UsageError(f"{config.ENV_WARM_RESTART} must be on or off (got {args.warm_restart!r})")
    if args.memory_tier not in config.MEMORY_TIER_MODES:
        raise UsageError(f"{config.ENV_MEMORY_TIER} must be one of {', '.join(config.MEMORY_TIER_MODES)} "
                         f"(got {args.memory_tier!r})")
    if args.memory_redundancy not in config.MEMORY_REDUNDANCY_SCHEMES:
        raise UsageError(f"{config.ENV_MEMORY_REDUNDANCY} must be one of {', '.join(config.MEMORY_REDUNDANCY_SCHEMES)} "
                         f"(got {args.memory_redundancy!r})")
    if os.environ.get("JITCKPT_MEMORY_XOR_GROUP"):
        raise UsageError(f"JITCKPT_MEMORY_XOR_GROUP is now {config.ENV_MEMORY_GROUP} (the nodes per group of the "
                         "xor and rs schemes)")
    for name, what in ((config.ENV_MEMORY_GROUP, "a number of nodes"), (config.ENV_MEMORY_PARITIES, "a number"),
                       (config.ENV_MEMORY_COPIES, "a number")):
        value = os.environ.get(name, "")
        if value and not (value.isdigit() and int(value) >= 1):
            raise UsageError(f"{name} must be {what}, 1 or more (got {value!r})")
    if args.memory_redundancy == "rs" and args.memory_tier != "off":
        from jitckpt.store import isal

        try:
            isal.library()
        except isal.IsalUnavailable as exc:
            raise UsageError(f"--memory-redundancy rs: {exc}") from None
    try:
        root = check_writable(args.checkpoint_dir or default_checkpoint_dir(args.command))
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None

    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    run_dir = root / ".jitckpt" / f"run-{run_id}"
    make_private_dir(run_dir, parents=True)
    shm_root = Path("/dev/shm") if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else run_dir
    shm_dir = shm_root / f"jitckpt-{run_id}"

    env = dict(os.environ)
    package_parent = Path(__file__).resolve().parents[2]
    bootstrap = package_parent / "jitckpt" / "worker" / "_bootstrap"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(bootstrap), str(package_parent), env.get("PYTHONPATH", "")) if p)
    env.update({
        config.ENV_ACTIVE: config.ACTIVE_IN_AGENT,  # the agent switches it to "1" for its workers
        config.ENV_CHECKPOINT_DIR: str(root),
        config.ENV_HANG_TIMEOUT: str(float(args.hang_timeout)),
        config.ENV_SAVE_GRACE: str(float(args.save_grace)),
        config.ENV_FAULT: args.fault,
        config.ENV_RUN_DIR: str(run_dir),
        config.ENV_SHM_DIR: str(shm_dir),
        config.ENV_WARM_RESTART: args.warm_restart,
        config.ENV_MEMORY_TIER: args.memory_tier,
        config.ENV_MEMORY_REDUNDANCY: args.memory_redundancy,
        config.ENV_ALLOW_INEXACT_RESUME: "1" if args.allow_inexact_resume else "0",
    })
    # torch >= 2.4 lets the workers share the rendezvous store hosted by the
    # agent of group rank 0.  If that node is lost, the others cannot form the
    # next round: with torch 2.13 the surviving and the replacement agents
    # fail with DistStoreError (plain torchrun too; tests/test_multinode.py).
    # The workers' own store, the behaviour before 2.4, survives that.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # ProcessGroupNCCL must not end a survivor before its JIT save is done (hang
    # timeout + save grace; unverified on GPU).  ASYNC_ERROR_HANDLING=0: on an NCCL
    # error or a collective timeout its watchdog neither aborts the communicators
    # nor ends the process (torchrun would set 1: the end, ~60 s after the error).
    # Its heartbeat monitor ends the process HEARTBEAT_TIMEOUT_SEC after any rank
    # flags a timeout or error: keep that past the save.  A user's setting wins.
    save_by = float(args.hang_timeout) + float(args.save_grace)
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", env.get("NCCL_ASYNC_ERROR_HANDLING", "0"))
    env.setdefault("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", str(int(save_by) + 61))
    if env["TORCH_NCCL_ASYNC_ERROR_HANDLING"].strip() != "0":
        say(f"warning: TORCH_NCCL_ASYNC_ERROR_HANDLING={env['TORCH_NCCL_ASYNC_ERROR_HANDLING']} (yours) lets "
            f"PyTorch's NCCL watchdog abort the communicators or end the process about a minute after an NCCL "
            f"error or timeout, which can beat the JIT save (hang timeout + save grace = {save_by:g}s); unset, "
            f"jit-run sets 0")
    heartbeat = env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"].strip()
    if env.get("TORCH_NCCL_ENABLE_MONITORING", "1").strip().lower() not in ("0", "false", "no", "off") and (
            not heartbeat.isdigit() or int(heartbeat) < save_by):
        say(f"warning: TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={heartbeat} (yours): PyTorch's NCCL heartbeat monitor "
            f"ends the process that long after a collective timeout or NCCL error, which can beat the JIT save "
            f"(hang timeout + save grace = {save_by:g}s); unset, jit-run sets {int(save_by) + 61}")
    if args.emulated_gpus is not None:
        from jitckpt.native import emulator

        try:
            env = emulator.job_environment(env, args.emulated_gpus)
        except (ValueError, native.NativeMissing) as exc:
            raise UsageError(str(exc)) from None
    if args.interpose == "on" or (args.interpose == "auto" and (args.emulated_gpus or Path("/dev/nvidiactl").exists())):
        from jitckpt.doctor import runtime_abi

        # The interposer covers CUDA 13 (libcudart.so.13) only: a CUDA 12 PyTorch is left to the Python watchdog.
        gap = None if {"--no-python", "--no_python"} & set(torchrun_args) else runtime_abi.interposer_gap()
        if gap is not None:
            say(f"warning: {gap}")
        else:
            try:
                env = _with_interposer(env)
            except UsageError as exc:
                if args.interpose == "on":
                    raise
                say(f"warning: running without the CUDA/NCCL interposition library ({exc}); "
                    f"the Python watchdog stays in charge")
    # (-u: the agent's output is not held back; and the template forked from it has the workers' `python -u` flags)
    return [sys.executable, "-u", "-m", "jitckpt.launch.agent", *torchrun_args], env, run_dir


def _with_interposer(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the interposition library first on LD_PRELOAD (built first if needed)."""
    from jitckpt.native import interposer

    try:
        library = interposer.library_path()
    except native.NativeMissing as exc:
        raise UsageError(f"the interposition library is missing ({exc}); use --interpose off to run without it") from None
    env = dict(env)
    env["LD_PRELOAD"] = " ".join(p for p in (str(library), env.get("LD_PRELOAD", "")) if p)
    return env


def explicit_options(argv: list[str], args: argparse.Namespace) -> list[str]:
    """The dests of the jit-run options given on the command line (not from defaults or the environment)."""
    own = argv[:len(argv) - len(args.command)] if args.command else list(argv)
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
        action.required = False
    given = parser.parse_args(own)
    return sorted(vars(given))


def _keep_memory_snapshots(root: Path, shm_dir: Path) -> None:
    """The job did not finish: keep on disk the memory tier's snapshots that complete its newest step."""
    memory = MemoryStore(shm_dir)
    if not memory.root.is_dir():
        return
    try:
        kept = keep_on_disk(DiskStore(root), memory, peer_copies(root))
    except OSError as exc:
        say(f"could not keep the memory tier's snapshots on disk ({exc}); a rerun falls back to the newest "
            f"checkpoint in {root} that covers every shard")
        return
    if kept is not None:
        step, ranks = kept
        say(f"kept the memory tier's snapshots of minibatch {step} ({', '.join(ranks)}) in {root}: with the JIT "
            f"checkpoints there they cover every shard, so rerunning the same command resumes from minibatch {step}")


def say(message: str) -> None:
    emit(f"[jit-run] {message}")


def main(argv: list[str]) -> int:
    """Run a job; returns torchrun's exit status, ``JOB_STOPPED_EXIT_CODE`` for a stopped job, 2 for bad input."""
    if os.environ.get(config.ENV_ENABLE, "1") == "0":
        args = build_parser().parse_args(argv)
        if not args.command:
            say("no command given")
            return 2
        try:
            return subprocess.call(args.command)  # admin switch: plain pass-through
        except OSError as exc:
            say(f"error: cannot run {args.command[0]!r}: {exc.strerror or exc}")
            return 127
    args = build_parser().parse_args(argv)
    if args.transparent:
        from jitckpt.launch import transparent

        return transparent.main(args, explicit_options(argv, args))
    if args.proxy_cudart is not None or args.proxy_nccl is not None:
        say("error: --proxy-cudart and --proxy-nccl are options of transparent mode: add --transparent")
        return 2
    try:
        agent_cmd, env, run_dir = prepare(args)
    except UsageError as exc:
        say(f"error: {exc}")
        return 2
    root = Path(env[config.ENV_CHECKPOINT_DIR])
    store = DiskStore(root)
    for removed in store.prune(args.keep):
        say(f"pruned old checkpoint {removed}")
    # A save never outlives the grace period (torchrun kills it then), so an
    # older partial directory is a dead save's leftover, on any node.
    for removed in store.remove_torn_saves(older_than=2 * float(args.save_grace)):
        say(f"removed the leftover of a save that never committed: {removed}")
    steps = store.list_steps()
    existing = next((step for step in steps if is_complete(store, step)), None)
    if existing is not None:
        say(f"{root} already holds a complete checkpoint of minibatch {existing}: this job resumes from it. "
            f"For a new job, pass a fresh --checkpoint-dir")
    elif steps:
        say(f"warning: {root} holds checkpoint folders ({', '.join(f'minibatch {s}' for s in steps[:4])}"
            f"{', ...' if len(steps) > 4 else ''}) but none is complete (a copy of every shard, with its metadata "
            f"and file sizes intact): this job starts from minibatch 0, and the ranks say what is wrong with each. "
            f"Nothing there is deleted")
    torchrun_args = agent_cmd[4:]
    say(f"checkpoint dir {root}, hang timeout {float(args.hang_timeout):g}s, save grace {float(args.save_grace):g}s")
    if args.fault:
        say(f"fault injection armed: {args.fault}")
    if max_restarts(torchrun_args) == 0:
        say("note: --max-restarts is 0, so torchrun will not restart after a failure; "
            "the JIT checkpoint is kept and rerunning the same command resumes from it")
    say("launching torchrun " + " ".join(torchrun_args))

    os.environ[config.ENV_RUN_DIR] = str(run_dir)
    eventlog.record("launch", command=args.command)
    child = subprocess.Popen(agent_cmd, env=env)
    code: int | None = None
    try:
        code = wait_forwarding_signals(child)
    finally:
        if code != 0:
            _keep_memory_snapshots(root, Path(env[config.ENV_SHM_DIR]))
        else:  # (the copies and parities a JIT save handed over for another host's ranks: the job is done with them)
            shutil.rmtree(peer_copies(root).root, ignore_errors=True)
            shutil.rmtree(parity_area(root), ignore_errors=True)
        shutil.rmtree(env[config.ENV_SHM_DIR], ignore_errors=True)

    result = report.build(eventlog.read_all(run_dir), code, args.command)
    report_path = Path(args.report) if args.report else root / "jitckpt-report.json"
    print(report.render(result), file=sys.stderr, flush=True)
    try:
        report.write(result, report_path)
        report.write(result, run_dir / "report.json")
        say(f"report written to {report_path}")
    except OSError as exc:
        say(f"could not write the report to {report_path}: {exc}")
    if result["stopped_because"]:
        say(f"the job stopped: resuming would not have repeated the fault-free run (the reason is above); the "
            f"checkpoints are kept. Rerun with --allow-inexact-resume to go on anyway, or with a fresh "
            f"--checkpoint-dir to start afresh (jit-run exits with {result['exit_code']}; torchrun's status was {code})")
        return result["exit_code"]
    if code != 0:
        say(f"the job failed (torchrun exit status {code})" +
            ("; rerun the same command to resume from the newest JIT checkpoint" if max_restarts(torchrun_args) == 0 else ""))
    return code
