"""`jit-run --transparent torchrun ...`: run a job in transparent mode, one device proxy per rank.

In transparent mode the program runs unchanged, and every CUDA runtime and
NCCL call it makes goes to a device proxy (``jitckpt-proxy``, one per rank),
the only process holding GPU state (``proxy_server/README.md``).  This module
is jit-run's part of it:

1. **Check first**, before anything starts: the native parts must be built
   (``native_parts``); then (``check_native``/``check_python``)
   ``jit-run doctor``'s analysis of the program, whose transparent
   verdict says whether ``libjitckpt_remote.so`` handles every CUDA runtime and
   NCCL function it imports (``jitckpt.doctor``; the coverage list is
   generated from the remote library's own stubs).  A refusal (exit status 2)
   names each reason and each refused function: functions the remote library
   refuses, the driver API, cuBLAS/cuDNN and other libraries with their own
   static runtime, a statically linked runtime, a program that cannot be
   found, one with no CUDA at all.  For a Python job the check is on the CUDA
   libraries the installed PyTorch loads (``torch/lib/libtorch_cuda.so`` and
   its dependencies); a CPU-only PyTorch has no CUDA to intercept, and is
   refused for that reason.
2. **Choose the libraries the proxies load** (``proxy_libraries``, DESIGN
   decision 7): the CUDA runtime and NCCL the program itself would load,
   found the way the dynamic loader finds them (doctor's resolution of the
   program, or of PyTorch's ``libtorch_cuda.so`` for a Python job: RPATH and
   RUNPATH, ``LD_LIBRARY_PATH``, ``ld.so.cache``).  The CPU device emulator's
   only when asked for: ``--emulated-gpus N``, or by putting it on
   ``LD_LIBRARY_PATH`` (the program then loads it too); ``--proxy-cudart`` and
   ``--proxy-nccl`` name files outright.  jit-run says once which files the
   proxies load, and refuses, naming what it searched, when there is no
   runtime to load.
3. **Rewrite the command** (``worker_command``): torchrun starts, for every
   local rank, ``jitckpt-proxy --socket DIR/rank-%r.sock --cudart PATH
   [--nccl PATH] --preload libjitckpt_remote.so -- PROGRAM ARGS`` (with
   ``--no-python``), where PROGRAM is the native program, or
   ``python -u script.py`` for a Python job.  The proxy's supervisor spawns
   the program with the remote library preloaded and exits with its status;
   ``%r`` becomes the rank (torchrun gives every local worker the same argv).
   DIR is private (0700, under ``$XDG_RUNTIME_DIR`` when usable, else a
   temporary directory) and removed at exit.
4. **Environment**: the user's, unchanged (with ``--emulated-gpus N``, the
   emulator's directory first on ``LD_LIBRARY_PATH`` and N devices; on the
   emulator the proxy finds kernel twins through ``JITCKPT_SIMDEV_KERNELS``), plus ``JITCKPT_TRANSPARENT=1``,
   ``JITCKPT_PYTHON`` (the interpreter the remote library runs
   ``-m jitckpt.transparent.rendezvous`` with during a recovery), and jit-run's
   worker bootstrap on ``PYTHONPATH`` (for a Python program: the minibatch
   boundary hooks, ``jitckpt.transparent.phases``); ``--hang-timeout``, when
   given, becomes ``JITCKPT_HANG_TIMEOUT``, which the remote library's
   recovery reads.  The other user-level options are refused.

Without torchrun (``jit-run --transparent ./program args``) the program runs
as one rank behind one proxy, without torchrun's store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from jitckpt import config, native
from jitckpt.console import emit
from jitckpt.launch.child import wait_forwarding_signals

# jit-run options that belong to user-level mode only (argparse dests).
USER_LEVEL_OPTIONS = {
    "checkpoint_dir": "--checkpoint-dir", "save_grace": "--save-grace", "report": "--report", "fault": "--fault",
    "warm_restart": "--warm-restart", "keep": "--keep", "interpose": "--interpose",
    "allow_inexact_resume": "--allow-inexact-resume",
}
# A Unix socket address holds at most 107 bytes of path (sun_path is 108 with its NUL).
SOCKET_PATH_MAX = 107
SOCKET_NAME = "rank-%r.sock"
# The longest value %r can become (jitckpt-proxy accepts ranks of up to 10 digits).
RANK_DIGITS_MAX = 10
# Refused imports listed one by one in a refusal, at most.
LISTED_MAX = 30
BUILD_HINT = "make -C proxy_server -j2"


class Refused(Exception):
    """jit-run --transparent will not run this job; the message says why (exit status 2)."""


@dataclass
class Job:
    """What to run: a native program or a Python script, under torchrun or as one bare rank."""

    kind: str                                  # "native" or "python"
    target: str                                # the program or script, as the messages name it
    program: list[str]                         # argv the proxy spawns
    torchrun_options: Optional[list[str]]      # None: no torchrun (one rank)
    notes: list[str] = field(default_factory=list)


def say(message: str) -> None:
    """One jit-run line on stderr."""
    emit(f"[jit-run] {message}")


# ---- the command -----------------------------------------------------------------------------------


def _torchrun_arguments(command: list[str]) -> Optional[list[str]]:
    """torchrun's arguments if ``command`` is a torchrun command, else None."""
    if command and Path(command[0]).name == "torchrun":
        return command[1:]
    if len(command) >= 3 and Path(command[0]).name.startswith("python") and command[1:3] == ["-m", "torch.distributed.run"]:
        return command[3:]
    return None


def _resolve_program(name: str) -> Path:
    """The executable ``name`` names (a path, or a command on PATH); Refused if there is none."""
    if "/" in name:
        path = Path(name)
        if not path.exists():
            raise Refused(f"cannot find the program {name!r}: no such file")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise Refused(f"{name!r} is not an executable program")
        return path.resolve()
    found = shutil.which(name)
    if found is None:
        raise Refused(f"cannot find the program {name!r}: not a file here and not a command on PATH")
    return Path(found).resolve()


def parse_command(command: list[str]) -> Job:
    """The job ``command`` describes; Refused for what transparent mode cannot run.

    ``torchrun [options] --no-python PROGRAM ARGS`` is a native job,
    ``torchrun [options] [-m] SCRIPT ARGS`` a Python one (torchrun's own
    parser reads the options); anything else is one bare rank:
    ``python[3] script.py ARGS`` a Python job, any other command a native one.
    """
    if not command:
        raise Refused("no command given: `jit-run --transparent torchrun --nproc_per_node N --no-python ./program ...` "
                      "or `... torchrun --nproc_per_node N train.py ...`")
    torchrun_args = _torchrun_arguments(command)
    if torchrun_args is None:
        if Path(command[0]).name.startswith("python"):
            scripts = [a for a in command[1:] if not a.startswith("-")]
            if not scripts:
                raise Refused(f"`{' '.join(command)}` runs no script: transparent mode runs `python script.py ...`")
            return Job("python", scripts[0], list(command), None)
        program = _resolve_program(command[0])
        return Job("native", command[0], [str(program), *command[1:]], None)

    from torch.distributed.run import get_args_parser  # torchrun's own reading of its options

    try:
        parsed = get_args_parser().parse_args(torchrun_args)
    except SystemExit as exc:
        raise Refused("torchrun does not accept these options (its message is above)" if exc.code
                      else "torchrun printed its help; nothing to run") from None
    if getattr(parsed, "run_path", False):
        raise Refused("torchrun --run-path runs the script inside torchrun's own process, where no device proxy "
                      "can be put in front of it; leave --run-path out")
    script_args = list(parsed.training_script_args)
    index = len(torchrun_args) - len(script_args) - 1
    if index < 0 or torchrun_args[index] != parsed.training_script:
        raise Refused(f"cannot tell torchrun's options from the program in {' '.join(torchrun_args)!r}")
    options = [a for a in torchrun_args[:index] if a not in ("--no-python", "--no_python", "-m", "--module")]
    if parsed.no_python:
        program = _resolve_program(parsed.training_script)
        return Job("native", parsed.training_script, [str(program), *script_args], options)
    if parsed.module:
        return Job("python", f"-m {parsed.training_script}",
                   [sys.executable, "-u", "-m", parsed.training_script, *script_args], options)
    if not Path(parsed.training_script).is_file():
        raise Refused(f"cannot find the training script {parsed.training_script!r}")
    return Job("python", parsed.training_script, [sys.executable, "-u", parsed.training_script, *script_args], options)


def worker_command(job: Job, proxy: Path, socket_template: str, preload: Path,
                   cudart: Optional[str] = None, nccl: Optional[str] = None,
                   cublas: Optional[str] = None, cublaslt: Optional[str] = None,
                   cudnn: Optional[str] = None) -> list[str]:
    """The command that starts the job: torchrun (or, bare, one proxy) with every worker behind its own proxy."""
    behind_proxy = [str(proxy), "--socket", socket_template]
    if cudart:
        behind_proxy += ["--cudart", cudart]
    if nccl:
        behind_proxy += ["--nccl", nccl]
    if cublas:
        behind_proxy += ["--cublas", cublas]
    if cublaslt:
        behind_proxy += ["--cublaslt", cublaslt]
    if cudnn:
        behind_proxy += ["--cudnn", cudnn]
    behind_proxy += ["--preload", str(preload), "--", *job.program]
    if job.torchrun_options is None:
        return behind_proxy
    return [sys.executable, "-m", "torch.distributed.run", *job.torchrun_options, "--no-python", *behind_proxy]


# ---- the check -------------------------------------------------------------------------------------


def _verdict_lines(report: Any, target: str) -> list[str]:
    """Why doctor's transparent verdict refuses ``report``'s program: every reason, every refused function."""
    from jitckpt.doctor.symbols import NCCL, RUNTIME

    verdict = report.transparent
    lines = [f"transparent mode cannot run {target}:"]
    if verdict.status == "not applicable" and report.provider_summary is None:
        lines = [f"transparent mode has nothing to intercept in {target}: it and its libraries use no CUDA runtime or "
                 "NCCL function (run it without --transparent; a program that loads CUDA with dlopen is not "
                 "supported in transparent mode)"]
        return lines
    refused = [i for i in report.imports
               if i.symbol.category in (RUNTIME, NCCL) and i.status not in ("covered", "coverage unknown")]
    for reason in verdict.reasons:
        # (the functions not covered are listed one by one below, each with its reason)
        listed_below = bool(refused) and " not covered (" in reason.short
        lines.append(f"  - {reason.short}" + (f": {reason.detail}" if reason.detail and not listed_below else ""))
    if refused:
        lines.append(f"  functions transparent mode does not handle ({len(refused)}):")
        for imp in refused[:LISTED_MAX]:
            lines.append(f"    {imp.symbol.display} (in {imp.importer}): {imp.reason}")
        if len(refused) > LISTED_MAX:
            lines.append(f"    ... and {len(refused) - LISTED_MAX} more")
    return lines


def _analyse(path: Path, ld_library_path: str) -> Any:
    from jitckpt.doctor import DoctorError, LibrarySearch, analyse

    try:
        return analyse(path, search=LibrarySearch(ld_library_path=ld_library_path))
    except DoctorError as exc:
        raise Refused(f"cannot analyse {path}: {exc}") from None


def check_native(job: Job, env: dict[str, str]) -> tuple[list[str], Any]:
    """Doctor's analysis of the native program: (notes worth saying, the report); raises Refused with every reason."""
    path = Path(job.program[0])
    report = _analyse(path, env.get("LD_LIBRARY_PATH", ""))
    if report.transparent.status != "ok":
        raise Refused("\n".join(_verdict_lines(report, job.target)
                                + [f"  (`jit-run doctor {path}` shows the whole analysis)"]))
    notes = [f"note: {caveat}" for caveat in report.transparent.caveats]
    for missing in report.missing:
        if not missing.needed.startswith("libcuda.so"):
            notes.append(f"warning: {missing.needed}, needed by {missing.needed_by}, is not found with this "
                         f"environment's LD_LIBRARY_PATH; the program may not start"
                         + (" (on the CPU emulator: LD_LIBRARY_PATH=$(jit-run emulator-path), or --emulated-gpus N)"
                            if missing.needed.startswith(("libcudart", "libnccl")) else ""))
    return notes, report


def check_python(job: Job, env: dict[str, str]) -> tuple[list[str], Any]:
    """The check of a Python job: the CUDA libraries the installed PyTorch loads; (notes, the report of
    ``libtorch_cuda.so``); raises Refused."""
    from jitckpt.doctor.runtime_abi import torch_runtime

    found = torch_runtime()
    if found is None:
        raise Refused(f"PyTorch is not installed for {sys.executable}; transparent mode checks the CUDA libraries "
                      "PyTorch would load before it runs a Python job")
    if found.abi is None:
        raise Refused(f"transparent mode has nothing to intercept in {job.target}: the installed PyTorch "
                      f"({found.torch_dir}) is a CPU-only build, which loads no CUDA runtime and no NCCL, so there "
                      "is no CUDA call to forward to a device proxy. Run it without --transparent (user-level mode)")
    library = found.torch_dir / "lib" / "libtorch_cuda.so"
    if not library.is_file():
        raise Refused(f"PyTorch at {found.torch_dir} uses {found.abi.summary} but {library} is missing, so its CUDA "
                      "use cannot be checked")
    report = _analyse(library, env.get("LD_LIBRARY_PATH", ""))
    if report.transparent.status != "ok":
        raise Refused("\n".join(_verdict_lines(report, f"{job.target} (PyTorch's CUDA library {library})")
                                + [f"  (`jit-run doctor {library}` shows the whole analysis)"]))
    return ([f"note: {caveat}" for caveat in report.transparent.caveats]
            + ["note: only PyTorch's own CUDA libraries were checked; CUDA extension modules the script imports "
               "are not (run `jit-run doctor` on them)"], report)


# ---- the libraries the proxies load ---------------------------------------------------------------

CUDART_SONAME = "libcudart.so.13"
NCCL_SONAME = "libnccl.so.2"
CUBLAS_SONAME = "libcublas.so.13"
CUBLASLT_SONAME = "libcublasLt.so.13"
CUDNN_SONAME = "libcudnn.so.9"


@dataclass
class ProxyLibraries:
    """The CUDA runtime, NCCL, cuBLAS, cuBLASLt and cuDNN every proxy of the job loads, each with how it was
    chosen."""

    cudart: str
    cudart_how: str
    nccl: Optional[str]        # None: none found, and the program does not use NCCL
    nccl_how: str
    cublas: Optional[str] = None   # None: the program loads none (its cuBLAS calls, if any, fail by name)
    cublas_how: str = ""
    cublaslt: Optional[str] = None  # None: the program loads none
    cublaslt_how: str = ""
    cudnn: Optional[str] = None  # None: the program loads none
    cudnn_how: str = ""

    def line(self) -> str:
        """The one line jit-run says about them."""
        if self.nccl is None:
            line = f"proxy: CUDA runtime {self.cudart} ({self.cudart_how}), no NCCL ({self.nccl_how})"
        elif self.nccl_how == self.cudart_how:
            line = f"proxy: CUDA runtime {self.cudart}, NCCL {self.nccl} (both {self.cudart_how})"
        else:
            line = f"proxy: CUDA runtime {self.cudart} ({self.cudart_how}), NCCL {self.nccl} ({self.nccl_how})"
        for what, path, how in (("cuBLAS", self.cublas, self.cublas_how),
                                ("cuBLASLt", self.cublaslt, self.cublaslt_how), ("cuDNN", self.cudnn, self.cudnn_how)):
            if path is not None:
                line += f"; {what} {path}" + ("" if how == self.cudart_how else f" ({how})")
        return line


@dataclass
class _Found:
    """One library for the proxies: where it is, how it was found, and whether it is the CPU device emulator's."""

    path: str
    how: str
    emulated: bool

    def described(self) -> str:
        return f"the CPU device emulator, {self.how}" if self.emulated else self.how


def _is_emulator(path: str) -> bool:
    """True if ``path`` is one of the CPU device emulator's libraries (doctor's test: its JITCKPT_SIMDEV marks)."""
    from jitckpt.doctor import DoctorError, read_elf

    try:
        obj = read_elf(path)
    except DoctorError:
        return False
    return any(v.startswith("JITCKPT_SIMDEV") for v in obj.version_definitions) or bool(obj.private_imports)


def _in_closure(report: Any, soname: str) -> Optional[_Found]:
    """``soname`` among the objects the program loads (doctor's resolution), if it is one of them."""
    from jitckpt.doctor import ROLE_EMULATED_NCCL, ROLE_EMULATED_RUNTIME

    for obj in report.objects[1:]:
        if obj.obj.file_name_starts((soname,)):
            return _Found(obj.obj.path, f"the one {report.root.obj.name} loads: {obj.found_via}",
                          obj.role in (ROLE_EMULATED_RUNTIME, ROLE_EMULATED_NCCL))
    return None


def _loader_search(report: Any, soname: str, env: dict[str, str]) -> Optional[_Found]:
    """``soname`` found as the loader would find it for the program's own dlopen (it does not link it)."""
    from jitckpt.doctor import LibrarySearch

    root = report.root.obj
    origin = os.path.dirname(os.path.realpath(root.path))
    path, how = LibrarySearch(ld_library_path=env.get("LD_LIBRARY_PATH", "")).find(soname, [(root, origin)], root)
    return _Found(path, f"on {root.name}'s library search path: {how}", _is_emulator(path)) if path else None


def _named(path: str, option: str) -> _Found:
    resolved = str(Path(path).resolve())
    return _Found(resolved, option, _is_emulator(resolved))


def _choose(named: Optional[str], option: str, soname: str, report: Any, env: dict[str, str]) -> Optional[_Found]:
    """The file ``option`` names, else the ``soname`` the program loads, else the one its search path holds."""
    if named:
        return _named(named, option)
    if report is None:
        return None
    return _in_closure(report, soname) or _loader_search(report, soname, env)


def _searched(report: Any, env: dict[str, str]) -> str:
    """Where the loader's search looks, in words, for a refusal."""
    root = report.root.obj
    places = []
    if root.rpath or root.runpath:
        places.append(f"{root.name}'s RPATH/RUNPATH ({':'.join(root.runpath or root.rpath)})")
    places.append(f"LD_LIBRARY_PATH ({env.get('LD_LIBRARY_PATH') or 'unset'})")
    places.append("/etc/ld.so.cache, the system library directories and /usr/local/cuda/lib64")
    return ", ".join(places)


def proxy_libraries(args: Any, report: Any, env: dict[str, str], target: str) -> ProxyLibraries:
    """The runtime and NCCL the proxies load (DESIGN decision 7); Refused when there is no runtime to load.

    By default the ones the program itself would load (``report`` is doctor's
    analysis of the program, or of PyTorch's ``libtorch_cuda.so`` for a Python
    job); the CPU device emulator's with ``--emulated-gpus``; the files named by
    ``--proxy-cudart``/``--proxy-nccl``.  Never the emulator by default.
    """
    named = [o for o, v in (("--proxy-cudart", args.proxy_cudart), ("--proxy-nccl", args.proxy_nccl)) if v]
    if args.emulated_gpus is not None:
        if named:
            raise Refused(f"--emulated-gpus and {' and '.join(named)} both say what the proxies load: give one "
                          "(--emulated-gpus N loads the CPU device emulator's libraries)")
        from jitckpt.native import emulator

        build = emulator.library_dir()
        how = f"the CPU device emulator: --emulated-gpus {args.emulated_gpus}"

        def emulated(soname: str) -> Optional[str]:  # (for a program that loads that library)
            path = build / soname
            used = path.exists() and report is not None and _in_closure(report, soname) is not None
            return str(path) if used else None

        return ProxyLibraries(str(build / CUDART_SONAME), how, str(build / NCCL_SONAME), how,
                              emulated(CUBLAS_SONAME), how, emulated(CUBLASLT_SONAME), how, emulated(CUDNN_SONAME),
                              how)
    cudart = _choose(args.proxy_cudart, "--proxy-cudart", CUDART_SONAME, report, env)
    if cudart is None:
        where = _searched(report, env) if report is not None else "nothing (no analysis of the program)"
        raise Refused(
            f"cannot find the CUDA runtime ({CUDART_SONAME}) that {target} would load, for its device proxies to "
            f"load: searched {where}. Install the CUDA 13 runtime (the CUDA toolkit, or `pip install "
            "nvidia-cuda-runtime`) and put its directory on LD_LIBRARY_PATH, or name the file with --proxy-cudart "
            "PATH; to test without a GPU, --emulated-gpus N runs the job on the CPU device emulator")
    nccl = _choose(args.proxy_nccl, "--proxy-nccl", NCCL_SONAME, report, env)
    if nccl is not None and cudart.emulated != nccl.emulated:
        emulated, real = (cudart, nccl) if cudart.emulated else (nccl, cudart)
        raise Refused(f"the proxies would load the CPU device emulator's {Path(emulated.path).name} "
                      f"({emulated.path}, {emulated.how}) with the real {Path(real.path).name} ({real.path}, "
                      f"{real.how}), which cannot work together: put both of one kind first on LD_LIBRARY_PATH, name "
                      "them with --proxy-cudart and --proxy-nccl, or give --emulated-gpus N")
    # cuBLAS, cuBLASLt and cuDNN (forwarded at the library level): the ones the program loads, of the runtime's
    # kind.
    def loaded(soname: str) -> tuple[Optional[str], str]:
        found = _in_closure(report, soname) if report is not None else None
        if found is None or found.emulated != cudart.emulated:
            return None, ""
        return found.path, found.described()

    blas = (*loaded(CUBLAS_SONAME), *loaded(CUBLASLT_SONAME), *loaded(CUDNN_SONAME))
    if nccl is None:
        return ProxyLibraries(cudart.path, cudart.described(), None,
                              f"{target} does not use NCCL and none is on its library search path", *blas)
    return ProxyLibraries(cudart.path, cudart.described(), nccl.path, nccl.described(), *blas)


def native_parts() -> tuple[Path, Path]:
    """(jitckpt-proxy, libjitckpt_remote.so); Refused, saying how to build them, when they are not built."""
    proxy = native.find(native.PROXY, native.PROXY_EXECUTABLE)
    remote = native.find(native.INTERPOSE, native.REMOTE_INTERPOSER)
    missing = [name for name, path in ((native.PROXY_EXECUTABLE, proxy), (native.REMOTE_INTERPOSER, remote))
               if path is None]
    if proxy is None or remote is None:
        reason = native.not_shipped_reason()
        if reason is not None:
            raise Refused(f"transparent mode's native parts are not installed ({', '.join(missing)}): {reason}")
        raise Refused(f"transparent mode's native parts are not built ({', '.join(missing)}): run `{BUILD_HINT}` "
                      f"in {native.SOURCE_ROOT} (it builds interpose/ and emulator/ too), or install a jitckpt wheel "
                      "built with them")
    try:
        native.trusted(native.PROXY, proxy.parent)
        native.trusted(native.INTERPOSE, remote.parent)
    except native.NativeMissing as exc:
        raise Refused(str(exc)) from None
    return proxy, remote


# ---- the sockets' directory ------------------------------------------------------------------------


def _candidate_parents(environ: dict[str, str]) -> list[Optional[str]]:
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    parents: list[Optional[str]] = []
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK | os.X_OK):
        parents.append(runtime)
    parents.append(None)  # tempfile's choice: TMPDIR, /tmp, ...
    return parents


def socket_dir(environ: Optional[dict[str, str]] = None) -> tuple[Path, str]:
    """A new private (0700) directory for the proxies' sockets and the ``--socket`` template in it.

    Under ``$XDG_RUNTIME_DIR`` when it is set and writable, else where
    ``tempfile.mkdtemp`` puts it.  Refused when every candidate would give a
    socket path longer than a Unix socket address holds.
    """
    environ = dict(os.environ) if environ is None else environ
    longest = ""
    for parent in _candidate_parents(environ):
        base = parent if parent is not None else tempfile.gettempdir()
        # mkdtemp's name: prefix + 8 random characters
        expected = os.path.join(base, "jitckpt-" + "x" * 8, SOCKET_NAME.replace("%r", "9" * RANK_DIGITS_MAX))
        if len(expected.encode()) > SOCKET_PATH_MAX:
            longest = longest or expected
            continue
        directory = Path(tempfile.mkdtemp(prefix="jitckpt-", dir=parent))
        os.chmod(directory, 0o700)
        return directory, str(directory / SOCKET_NAME)
    raise Refused(f"the proxies' socket paths would be too long ({len(longest.encode())} bytes, e.g. {longest}): "
                  f"a Unix socket path holds at most {SOCKET_PATH_MAX} bytes. Set XDG_RUNTIME_DIR or TMPDIR to a "
                  "shorter directory")


# ---- putting it together ---------------------------------------------------------------------------


@dataclass
class Launch:
    """A checked transparent-mode job, ready to start."""

    command: list[str]
    env: dict[str, str]
    directory: Path
    job: Job
    notes: list[str]
    libraries: ProxyLibraries


def prepare(args: Any, given: Sequence[str] = ()) -> Launch:
    """Check everything and build the command and environment; Refused for anything transparent mode cannot run.

    ``args`` is jit-run's parsed command line, ``given`` the dests of the jit-run
    options the user gave explicitly.
    """
    user_level = [USER_LEVEL_OPTIONS[d] for d in given if d in USER_LEVEL_OPTIONS]
    if user_level:
        raise Refused(f"{', '.join(sorted(user_level))} belong{'s' if len(user_level) == 1 else ''} to user-level "
                      "mode (JIT checkpoints of a Python job); transparent mode does not use "
                      f"{'it' if len(user_level) == 1 else 'them'}")
    for option, value in (("--proxy-cudart", args.proxy_cudart), ("--proxy-nccl", args.proxy_nccl)):
        if value is not None and not Path(value).is_file():
            raise Refused(f"{option} {value}: no such file")
    env = dict(os.environ)
    if args.emulated_gpus is not None:
        from jitckpt.native import emulator

        try:
            env = emulator.job_environment(env, args.emulated_gpus)
        except (ValueError, native.NativeMissing) as exc:
            raise Refused(str(exc)) from None
    proxy, remote = native_parts()  # (without them the coverage list is missing too: say the cause)
    job = parse_command(list(args.command))
    notes, report = check_native(job, env) if job.kind == "native" else check_python(job, env)
    libraries = proxy_libraries(args, report, env, job.target)
    if env.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "").strip() == "1" and job.torchrun_options is not None:
        notes.append("warning: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (yours): torchrun then does not share its store "
                     "with the workers, and transparent mode's recovery rendezvous (MASTER_ADDR:MASTER_PORT) finds "
                     "no store unless the program creates one")
    directory, template = socket_dir(env)
    package_parent = Path(__file__).resolve().parents[2]
    bootstrap = package_parent / "jitckpt" / "worker" / "_bootstrap"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(bootstrap), str(package_parent), env.get("PYTHONPATH", "")) if p)
    env[config.ENV_TRANSPARENT] = "1"
    env[config.ENV_PYTHON] = sys.executable
    env.pop(config.ENV_ACTIVE, None)  # user-level mode's runtime stays off in transparent mode
    if "hang_timeout" in given:  # else the user's JITCKPT_HANG_TIMEOUT, or the remote library's default
        env[config.ENV_HANG_TIMEOUT] = str(float(args.hang_timeout))  # read by the remote library's recovery
    command = worker_command(job, proxy, template, remote, libraries.cudart, libraries.nccl, libraries.cublas,
                             libraries.cublaslt, libraries.cudnn)
    return Launch(command, env, directory, job, notes, libraries)


def main(args: Any, given: Sequence[str] = ()) -> int:
    """Run ``jit-run --transparent ...``; returns the job's exit status (2 when refused)."""
    try:
        launch = prepare(args, given)
    except Refused as exc:
        lines = str(exc).splitlines()
        say(f"error: {lines[0]}")
        for line in lines[1:]:
            say(line)
        return 2
    try:
        for note in launch.notes:
            say(note)
        say(launch.libraries.line())
        job = launch.job
        shown = " ".join(launch.command[3:] if job.torchrun_options is not None else launch.command)
        say(f"transparent mode: {job.kind} program {job.target}, every rank's CUDA runtime and NCCL calls go to "
            f"its own jitckpt-proxy (sockets in {launch.directory}); launching "
            + ("torchrun " if job.torchrun_options is not None else "one rank: ") + shown)
        try:
            child = subprocess.Popen(launch.command, env=launch.env)
        except OSError as exc:
            say(f"error: cannot start {launch.command[0]!r}: {exc.strerror or exc}")
            return 127

        code = wait_forwarding_signals(child)
        if code < 0:  # killed by a signal
            code = 128 - code
        if code != 0:
            say(f"the job failed (exit status {code})")
        return code
    finally:
        shutil.rmtree(launch.directory, ignore_errors=True)
