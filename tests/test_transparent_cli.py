"""``jit-run --transparent``: checked by doctor first, one device proxy per rank, on the CPU emulator.

- refusals before anything starts (exit status 2), naming each reason: a
  program that does not exist, one with no CUDA at all, a Python job on a
  CPU-only PyTorch; options of the other mode; native parts not built;
- refusals when called, not when loaded (issue 19): a function
  ``libjitckpt_remote.so`` refuses returns an error naming it; a driver call,
  and a library's static CUDA runtime opening the driver, stop the job there,
  naming the library; linked but never called, the program runs;
- the command rewrite: torchrun starts ``jitckpt-proxy --socket DIR/rank-%r.sock
  ... -- PROGRAM ARGS`` for every worker, DIR private and removed at exit;
- ``jitckpt-proxy``'s ``%r``/``%l``/``%%`` in ``--socket`` (spawn mode);
- which CUDA runtime and NCCL the proxies load (DESIGN decision 7): the ones
  the program itself would load, said once; the CPU device emulator's only
  with ``--emulated-gpus`` (or when the user puts it on ``LD_LIBRARY_PATH``),
  never as a silent default; a clear refusal when there is no runtime;
- end to end: ``examples/cuda_mlp`` with 3 ranks through torchrun and three
  proxies, on ``--emulated-gpus 3``, ends with the same checksum as the same
  run without jitckpt.

Everything that runs a job runs on the CPU device emulator; nothing here says
anything about GPUs.  The one run without the emulator uses the machine's real
``libcudart.so.13``, which, with no GPU here, fails at the program's first call.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from argparse import Namespace
from pathlib import Path

import pytest

import jitckpt.native
from conftest import REPO, job_env
from jitckpt.launch import launcher, transparent
from native_toolchain import CUDA_HOME, EMULATOR_ENV, REQUIRES_CUDA_TOOLCHAIN

pytestmark = REQUIRES_CUDA_TOOLCHAIN

PROXY_DIR = REPO / "proxy_server"
PROXY = PROXY_DIR / "build" / "jitckpt-proxy"
REMOTE_LIB = REPO / "interpose" / "build" / "libjitckpt_remote.so"
EMULATOR_BUILD = REPO / "emulator" / "build"
MLP_DIR = REPO / "examples" / "cuda_mlp"
MLP = MLP_DIR / "build" / "mlp"
TWINS = MLP_DIR / "build" / "libmlp_twins.so"
TIMEOUT = 180

REFUSED_PROGRAM = r"""
/* A CUDA runtime program that calls two functions transparent mode refuses (the
 * emulator has neither: weak imports, so that it links; doctor reads the imports). */
#include <cuda_runtime_api.h>
#include <stdio.h>
extern __typeof__(cudaMallocArray) cudaMallocArray __attribute__((weak));
extern __typeof__(cudaMemPoolCreate) cudaMemPoolCreate __attribute__((weak));
int main(void)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, 1024);
    cudaArray_t a = NULL;
    struct cudaChannelFormatDesc d = {32, 0, 0, 0, cudaChannelFormatKindFloat};
    if (e == cudaSuccess && cudaMallocArray)
        e = cudaMallocArray(&a, &d, 16, 16, 0);
    printf("PROGRAM RAN: %s\n", cudaGetErrorString(e));
    cudaMemPool_t pool;
    struct cudaMemPoolProps props = {0};
    return cudaMemPoolCreate ? cudaMemPoolCreate(&pool, &props) != cudaSuccess : 0;
}
"""

DRIVER_PROGRAM = r"""
/* Calls the CUDA driver API (cuInit) besides the runtime. */
#include <cuda_runtime_api.h>
#include <stdio.h>
int cuInit(unsigned flags);
int main(void)
{
    void *p = NULL;
    printf("PROGRAM RAN: %d %d\n", cuInit(0), (int)cudaMalloc(&p, 16));
    return 0;
}
"""

ENTRY_POINT_PROGRAM = r"""
/* Fetches driver entry points as PyTorch's DriverAPI does at start-up, uses the runtime, and calls one
 * of them only when asked (argv[1] == "call"). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>
extern __typeof__(cudaGetDriverEntryPointByVersion) cudaGetDriverEntryPointByVersion __attribute__((weak));
int main(int argc, char **argv)
{
    const char *names[] = {"cuMemCreate", "cuGetErrorString", "cuStreamWriteValue32", "cuNoSuchFunction"};
    void *fns[4] = {0};
    for (int i = 0; i < 4; i++) {
        enum cudaDriverEntryPointQueryResult status = cudaDriverEntryPointVersionNotSufficent;
        cudaError_t e = cudaGetDriverEntryPointByVersion
                        ? cudaGetDriverEntryPointByVersion(names[i], &fns[i], 12000, cudaEnableDefault, &status)
                        : cudaErrorNotSupported;
        printf("FETCH %s: %s %s status %d\n", names[i], cudaGetErrorName(e), fns[i] ? "pointer" : "NULL", (int)status);
    }
    void *p = NULL;
    printf("PROGRAM RAN: %d\n", (int)cudaMalloc(&p, 16));
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "call") == 0 && fns[0])
        printf("CALLED: %d\n", ((int (*)(void *, size_t, const void *, unsigned long long))fns[0])(0, 0, 0, 0));
    return 0;
}
"""


STATIC_RUNTIME_LIBRARY = r"""
/* A library with its own copy of the CUDA runtime, as cuBLAS has: a local runtime function that opens the
 * driver at its first call (doctor reads the local definition). */
#include <dlfcn.h>
__attribute__((noinline, used)) static int cudaGetDeviceCount(int *count)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    *count = driver != 0;
    return driver == 0 ? 100 : 0;
}
int staticrt_devices(void) { int n = 0; return cudaGetDeviceCount(&n) == 0 ? n : -1; }
"""

USES_STATIC_RUNTIME = r"""
/* Links the library above; calls it only when given an argument. */
#include <cuda_runtime_api.h>
#include <stdio.h>
int staticrt_devices(void);
int main(int argc, char **argv)
{
    void *p = NULL;
    printf("PROGRAM RAN: %d\n", (int)cudaMalloc(&p, 16));
    fflush(stdout);
    if (argc > 1)
        printf("devices %d\n", staticrt_devices());
    return 0;
}
"""


@pytest.fixture(scope="session")
def built() -> None:
    """The proxy, the remote library, the emulator and the CUDA example, built."""
    for directory in (PROXY_DIR, EMULATOR_BUILD.parent, MLP_DIR):  # (the proxy's build does not build the emulator)
        proc = subprocess.run(["make", "-C", str(directory), "-j2"], capture_output=True, text=True)
        assert proc.returncode == 0, f"make -C {directory} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert PROXY.exists() and REMOTE_LIB.exists() and MLP.exists() and TWINS.exists()


def gcc(tmp_path: Path, name: str, source: str, *libs: str) -> Path:
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / name
    proc = subprocess.run(["gcc", "-O1", "-I", str(CUDA_HOME / "include"), "-o", str(out), str(src), *libs,
                           "-L", str(EMULATOR_BUILD), "-l:libcudart.so.13"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="session")
def refused_program(built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gcc(tmp_path_factory.mktemp("refused"), "refused", REFUSED_PROGRAM)


@pytest.fixture(scope="session")
def driver_program(built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A program linked against a stand-in libcuda.so.1 that defines cuInit."""
    directory = tmp_path_factory.mktemp("driver")
    stub = directory / "libcuda.so.1"
    (directory / "cuda_stub.c").write_text("int cuInit(unsigned flags) { (void)flags; return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub),
                    str(directory / "cuda_stub.c")], check=True)
    return gcc(directory, "driver", DRIVER_PROGRAM, str(stub), f"-Wl,-rpath,{directory}")


def emulator_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in job_env().items()
           if k not in (*EMULATOR_ENV, "LD_PRELOAD", "JITCKPT_PROXY_SOCKET", "JITCKPT_TRANSPARENT", "XDG_RUNTIME_DIR")}
    env["LD_LIBRARY_PATH"] = str(EMULATOR_BUILD)
    env.update(extra)
    return env


def jit_run(*args: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jitckpt", *args], capture_output=True, text=True,
                          env=env or emulator_env(), timeout=timeout, cwd=REPO)


def refused(result: subprocess.CompletedProcess) -> str:
    """The refusal's text, after checking it is one: status 2, nothing started."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "PROGRAM RAN" not in result.stdout and "launching" not in result.stderr
    assert "jitckpt remote[" not in result.stderr  # no worker ever ran behind a proxy
    return result.stderr


# ---- refusals --------------------------------------------------------------------------------------


def test_functions_the_remote_library_refuses_are_refused_when_called(refused_program: Path) -> None:
    """Not at load time (issue 19): the program runs, and each refused call returns an error that names it."""
    result = jit_run("--transparent", "torchrun", "--standalone", "--nproc_per_node", "2", "--no-python",
                     str(refused_program))
    err = result.stderr
    assert result.stdout.count("PROGRAM RAN: operation not supported") == 2, result.stdout + err
    assert "cudaMallocArray is not supported in transparent mode (not marshalled by remote mode yet)" in err, err
    assert "cudaMemPoolCreate is not supported in transparent mode" in err, err
    assert result.returncode != 0  # the program's own status: its cudaMemPoolCreate failed
    # doctor names them as refused when called
    doctor = jit_run("doctor", str(refused_program))
    assert doctor.returncode == 0
    assert "transparent mode OK" in doctor.stdout, doctor.stdout
    assert "refused when called: 2 CUDA runtime functions refused when called (cudaMallocArray, " \
           "cudaMemPoolCreate)" in " ".join(doctor.stdout.split()), doctor.stdout


def test_a_driver_call_stops_the_job_naming_it(driver_program: Path) -> None:
    """A direct driver call would reach the GPU past the proxy: the job stops at it (interpose/remote/bypass.c)."""
    result = jit_run("--transparent", str(driver_program))
    err = result.stderr
    assert result.returncode != 0 and "PROGRAM RAN" not in result.stdout, result.stdout + err
    assert re.search(r"stopping the job: driver called the CUDA driver function cuInit: it would reach the CUDA "
                     r"driver in the worker, past the device proxy", err), err
    assert "jit-run doctor driver" in err


def test_driver_entry_points_are_handed_out_as_stops_refused_when_called(built, tmp_path: Path) -> None:
    """PyTorch fetches a table of driver functions at start-up and calls few (issue 19): fetching works (the
    fence's stub, status success; an unknown name NULL, as the runtime answers), the job goes on, and only a
    call of a fetched function stops it, naming the function."""
    program = gcc(tmp_path, "entry_points", ENTRY_POINT_PROGRAM)
    fetched = jit_run("--transparent", str(program))
    out, err = fetched.stdout, fetched.stderr
    assert fetched.returncode == 0 and "PROGRAM RAN: 0" in out, out + err
    for name in ("cuMemCreate", "cuGetErrorString", "cuStreamWriteValue32"):
        assert f"FETCH {name}: cudaSuccess pointer status 0" in out, out
    assert "FETCH cuNoSuchFunction: cudaSuccess NULL status 1" in out, out
    assert "driver entry points (first: cuMemCreate) are handed out as stops" in err, err
    called = jit_run("--transparent", str(program), "call")
    assert called.returncode != 0 and "PROGRAM RAN: 0" in called.stdout and "CALLED" not in called.stdout, \
        called.stdout + called.stderr
    assert re.search(r"stopping the job: entry_points called the CUDA driver function cuMemCreate: it would reach the "
                     r"CUDA driver in the worker", called.stderr), called.stderr


def test_a_static_runtime_library_is_refused_when_it_opens_the_driver_not_when_linked(built, tmp_path: Path) -> None:
    """A library with its own static CUDA runtime (as cuBLAS has): linked and unused, the job runs; called, it
    stops at the library's dlopen of libcuda.so.1, naming the library."""
    (tmp_path / "static_rt.c").write_text(STATIC_RUNTIME_LIBRARY)
    library = tmp_path / "libstaticrt.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(library), str(tmp_path / "static_rt.c"), "-ldl"],
                   check=True)
    program = gcc(tmp_path, "uses_static_rt", USES_STATIC_RUNTIME, str(library), f"-Wl,-rpath,{tmp_path}")
    doctor = jit_run("doctor", "--json", str(program))
    transparent = __import__("json").loads(doctor.stdout)["verdict"]["transparent"]
    assert transparent["status"] == "ok" and any(
        c.startswith("refused when called: libstaticrt.so has its own static CUDA runtime") for c in transparent["caveats"]
    ), transparent
    unused = jit_run("--transparent", str(program))
    assert unused.returncode == 0 and "PROGRAM RAN: 0" in unused.stdout, unused.stdout + unused.stderr
    assert "stopping the job" not in unused.stderr
    used = jit_run("--transparent", str(program), "use-the-library")
    assert used.returncode != 0 and "PROGRAM RAN: 0" in used.stdout, used.stdout + used.stderr
    assert "devices" not in used.stdout  # stopped inside the library's call
    assert 'stopping the job: libstaticrt.so opened the CUDA driver (dlopen("libcuda.so.1"): a static CUDA ' \
           "runtime waking up, or direct driver calls)" in used.stderr, used.stderr


def test_refuses_what_it_cannot_find_or_has_nothing_to_intercept(built, tmp_path: Path) -> None:
    err = refused(jit_run("--transparent", "torchrun", "--nproc_per_node", "2", "--no-python", "./no-such-program"))
    assert "cannot find the program './no-such-program': no such file" in err
    err = refused(jit_run("--transparent", "no-such-command-jitckpt"))
    assert "not a file here and not a command on PATH" in err
    err = refused(jit_run("--transparent", "true"))
    assert "transparent mode has nothing to intercept" in err and "no CUDA runtime or NCCL function" in err
    err = refused(jit_run("--transparent", "torchrun", "--nproc_per_node", "2", "no_such_script.py"))
    assert "cannot find the training script 'no_such_script.py'" in err


@pytest.mark.skipif(__import__("torch").version.cuda is not None, reason="this PyTorch has CUDA")
def test_refuses_a_python_job_on_a_cpu_only_pytorch(built) -> None:
    err = refused(jit_run("--transparent", "torchrun", "--standalone", "--nproc_per_node", "2",
                          "examples/train_mlp.py"))
    assert "transparent mode has nothing to intercept in examples/train_mlp.py" in err
    assert "CPU-only build" in err and "without --transparent" in err


def test_refuses_options_of_the_other_mode(built) -> None:
    err = refused(jit_run("--transparent", "--fault", "rank=0,step=1,phase=forward,kind=kill",
                          "--checkpoint-dir", "/tmp/x", "torchrun", "--no-python", str(MLP)))
    assert "--checkpoint-dir, --fault belong to user-level mode" in err
    result = jit_run("--proxy-cudart", str(EMULATOR_BUILD / "libcudart.so.13"), "torchrun", "x.py")
    assert result.returncode == 2 and "options of transparent mode: add --transparent" in result.stderr
    err = refused(jit_run("--transparent", "--proxy-nccl", "/no/such/libnccl.so.2", str(MLP)))
    assert "--proxy-nccl /no/such/libnccl.so.2: no such file" in err


def test_refuses_when_the_native_parts_are_not_built(built, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(jitckpt.native, "find", lambda part, name: None)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(EMULATOR_BUILD))
    status = launcher.main(["--transparent", str(MLP), "--steps", "1"])
    err = capsys.readouterr().err
    assert status == 2 and "not built (jitckpt-proxy, libjitckpt_remote.so)" in err
    assert "make -C proxy_server -j2" in err


# ---- the command rewrite ---------------------------------------------------------------------------


def parsed(*argv: str) -> Namespace:
    return launcher.build_parser().parse_args(list(argv))


def test_torchrun_starts_a_proxy_per_worker(built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(EMULATOR_BUILD))
    monkeypatch.setenv("JITCKPT_ACTIVE", "1")
    cudart, nccl = EMULATOR_BUILD / "libcudart.so.13", EMULATOR_BUILD / "libnccl.so.2"
    launch = transparent.prepare(parsed("--transparent", "--proxy-cudart", str(cudart), "--proxy-nccl", str(nccl),
                                        "torchrun", "--standalone", "--nproc_per_node", "3", "--no-python",
                                        str(MLP),
                                        "--steps", "20"))
    try:
        directory = launch.directory
        assert directory.parent == runtime and stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert launch.command == [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3", "--no-python",
            str(PROXY.resolve()), "--socket", f"{directory}/rank-%r.sock", "--cudart", str(cudart.resolve()),
            "--nccl", str(nccl.resolve()), "--preload", str(REMOTE_LIB.resolve()), "--",
            str(MLP.resolve()), "--steps", "20"]
        env = launch.env
        assert env["JITCKPT_TRANSPARENT"] == "1" and env["JITCKPT_PYTHON"] == sys.executable
        assert "JITCKPT_ACTIVE" not in env  # user-level mode's runtime stays off
        assert env["PYTHONPATH"].split(os.pathsep)[0].endswith("jitckpt/worker/_bootstrap")
        assert env["LD_LIBRARY_PATH"] == str(EMULATOR_BUILD)  # the user's environment, unchanged
    finally:
        import shutil

        shutil.rmtree(launch.directory)


def test_python_jobs_run_the_script_with_this_interpreter(built, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """(The doctor check of PyTorch's CUDA libraries is stood in for: this PyTorch has none.)"""
    monkeypatch.setattr(transparent, "check_python", lambda job, env: ([], None))
    script = tmp_path / "train.py"
    script.write_text("")
    for given, program in (
        ([str(script), "--lr", "1"], [sys.executable, "-u", str(script), "--lr", "1"]),
        (["-m", "pkg.train", "--lr", "1"], [sys.executable, "-u", "-m", "pkg.train", "--lr", "1"]),
    ):
        launch = transparent.prepare(parsed("--transparent", "--emulated-gpus", "2", "torchrun", "--nnodes", "1",
                                            "--nproc-per-node", "2", *given))
        launch.directory.rmdir()
        tail = launch.command[launch.command.index("--") + 1:]
        assert tail == program
        assert launch.command[3:7] == ["--nnodes", "1", "--nproc-per-node", "2"]
        assert launch.command[7] == "--no-python" and launch.command[8] == str(PROXY.resolve())


# ---- which runtime the proxies load ----------------------------------------------------------------


def no_emulator_env(**extra: str) -> dict[str, str]:
    """The test environment without the emulator on LD_LIBRARY_PATH: what a user on a GPU host has."""
    env = emulator_env(**extra)
    env.pop("LD_LIBRARY_PATH")
    return env


def loader_finds(program: Path, soname: str, env: dict[str, str]) -> Path | None:
    """The file the dynamic loader itself maps for ``soname`` when ``program`` starts (ldd runs ld.so)."""
    out = subprocess.run(["ldd", str(program)], capture_output=True, text=True, env=env, timeout=60).stdout
    found = re.search(rf"^\s*{re.escape(soname)} => (/\S+)", out, re.M)
    return Path(found.group(1)).resolve() if found else None


def proxy_line(stderr: str) -> tuple[str, str | None, str]:
    """(CUDA runtime, NCCL, the whole line) from jit-run's one line about what the proxies load."""
    lines = [line for line in stderr.splitlines() if line.startswith("[jit-run] proxy: CUDA runtime ")]
    assert len(lines) == 1, stderr  # said once, however many ranks
    found = re.match(r"\[jit-run\] proxy: CUDA runtime (\S+?),? .*?(?:NCCL (\S+) |no NCCL)", lines[0])
    assert found, lines[0]
    return found.group(1), found.group(2), lines[0]


def test_without_emulated_gpus_the_proxies_load_the_runtime_the_program_loads(built, tmp_path: Path) -> None:
    """On a GPU host this is the real runtime; the CPU device emulator next to the proxy is never a silent default.

    Here the real libcudart.so.13 is installed but there is no GPU, so the run fails at the program's first
    CUDA call with the real runtime's own error -- not with the emulator's ("no host twin for kernel")."""
    env = no_emulator_env()
    cudart = loader_finds(MLP, "libcudart.so.13", env)
    nccl = loader_finds(MLP, "libnccl.so.2", env)
    assert cudart is not None and not cudart.is_relative_to(EMULATOR_BUILD.resolve())
    result = jit_run("--transparent", "torchrun", "--standalone", "--nproc_per_node", "1", "--no-python", str(MLP),
                     "--steps", "3", env=env)
    out = result.stdout + result.stderr
    loaded_cudart, loaded_nccl, line = proxy_line(result.stderr)
    assert Path(loaded_cudart).resolve() == cudart, line
    assert loaded_nccl is not None and Path(loaded_nccl).resolve() == nccl, line
    assert "emulator" not in line, line
    assert f"--cudart {loaded_cudart} --nccl {loaded_nccl} " in result.stderr  # what the proxies were given
    assert "no host twin" not in out and "jitckpt simulated GPU" not in out
    if not Path("/dev/nvidiactl").exists():  # no GPU: the real runtime says so at the first call
        assert result.returncode != 0, out[-3000:]
        assert re.search(r"cudaGetDeviceCount\(&ndev\) failed: cudaError(InsufficientDriver|NoDevice)", out), out[-3000:]


def test_with_emulated_gpus_the_proxies_load_the_emulator_and_say_so(built, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LD_LIBRARY_PATH", "JITCKPT_SIMDEV_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    launch = transparent.prepare(parsed("--transparent", "--emulated-gpus", "2", "torchrun", "--standalone",
                                        "--nproc_per_node", "2", "--no-python", str(MLP)))
    launch.directory.rmdir()
    cudart, nccl = (EMULATOR_BUILD / "libcudart.so.13").resolve(), (EMULATOR_BUILD / "libnccl.so.2").resolve()
    assert launch.command[launch.command.index("--cudart") + 1] == str(cudart)
    assert launch.command[launch.command.index("--nccl") + 1] == str(nccl)
    assert launch.libraries.line() == (f"proxy: CUDA runtime {cudart}, NCCL {nccl} (both the CPU device emulator: "
                                       "--emulated-gpus 2)")
    assert launch.env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == str(EMULATOR_BUILD.resolve())
    assert launch.env["JITCKPT_SIMDEV_DEVICES"] == "2"
    # --emulated-gpus with a file named for the proxies: two answers to one question
    with pytest.raises(transparent.Refused, match="--emulated-gpus and --proxy-cudart both say what the proxies load"):
        transparent.prepare(parsed("--transparent", "--emulated-gpus", "1", "--proxy-cudart", str(cudart),
                                   str(MLP)))


def test_the_emulator_on_the_users_ld_library_path_is_what_the_program_loads(built, monkeypatch) -> None:
    """LD_LIBRARY_PATH=$(jit-run emulator-path): the program itself would load the emulator, so the proxies do,
    and the line says it is the emulator; the emulator's runtime with a real NCCL is refused."""
    monkeypatch.setenv("LD_LIBRARY_PATH", str(EMULATOR_BUILD))
    launch = transparent.prepare(parsed("--transparent", str(MLP)))
    launch.directory.rmdir()
    cudart = EMULATOR_BUILD / "libcudart.so.13"
    assert Path(launch.libraries.cudart).resolve() == cudart.resolve()
    assert "(both the CPU device emulator, the one mlp loads: LD_LIBRARY_PATH)" in launch.libraries.line()
    real_nccl = loader_finds(MLP, "libnccl.so.2", no_emulator_env())
    assert real_nccl is not None
    with pytest.raises(transparent.Refused, match=r"the CPU device emulator's libcudart.so.13 .* with the real "
                                                  r"libnccl.so.2 .* cannot work together"):
        transparent.prepare(parsed("--transparent", "--proxy-nccl", str(real_nccl), str(MLP)))


PLAIN_PROGRAM = r"""
/* An ordinary CUDA runtime program (libcudart.so.13 by name, no RUNPATH). */
#include <cuda_runtime_api.h>
#include <stdio.h>
int main(void)
{
    void *p = NULL;
    printf("PROGRAM RAN: %d\n", (int)cudaMalloc(&p, 16));
    return 0;
}
"""


def where_no_runtime_is_found(empty: Path, *command: str) -> list[str]:
    """``command`` on a host whose loader finds no libcudart.so.13: in a private mount namespace, with an empty
    ld.so.cache and the CUDA toolkit's directory hidden by an empty one."""
    script = 'mount --bind /dev/null /etc/ld.so.cache && mount --bind "$1" "$2" && shift 2 && exec "$@"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(empty), str(CUDA_HOME),
            *command]


def test_no_runtime_to_load_is_refused_naming_what_was_searched(built, tmp_path: Path) -> None:
    program = gcc(tmp_path, "plain", PLAIN_PROGRAM)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = no_emulator_env()
    probe = subprocess.run(where_no_runtime_is_found(empty, "true"), capture_output=True, text=True, timeout=60)
    if probe.returncode != 0 or shutil.which("unshare") is None:
        pytest.skip(f"cannot hide the CUDA runtime here (unshare -m and mount need CAP_SYS_ADMIN): {probe.stderr}")
    direct = subprocess.run(where_no_runtime_is_found(empty, str(program)), capture_output=True, text=True,
                            env=env, timeout=60)
    assert direct.returncode == 127 and "libcudart.so.13: cannot open shared object file" in direct.stderr, \
        direct.stderr  # the loader finds no runtime for the program itself
    result = subprocess.run(where_no_runtime_is_found(empty, sys.executable, "-m", "jitckpt", "--transparent",
                                                      str(program)),
                            capture_output=True, text=True, env=env, timeout=TIMEOUT, cwd=REPO)
    err = refused(result)
    assert f"cannot find the CUDA runtime (libcudart.so.13) that {program} would load" in err
    assert "LD_LIBRARY_PATH (unset)" in err and "/etc/ld.so.cache" in err
    assert "--proxy-cudart PATH" in err and "--emulated-gpus N runs the job on the CPU device emulator" in err


def test_socket_paths_that_would_be_too_long_are_refused(built, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with pytest.raises(transparent.Refused, match="at most 107 bytes. Set XDG_RUNTIME_DIR or TMPDIR"):
        transparent.socket_dir()
    assert not any(p.name.startswith("jitckpt-") for p in deep.iterdir())
    # a long XDG_RUNTIME_DIR falls back to a short temporary directory
    short = tmp_path / "t"
    short.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    directory, template = transparent.socket_dir()
    assert directory.parent == short and template == f"{directory}/rank-%r.sock"
    directory.rmdir()


# ---- %r in jitckpt-proxy --socket ------------------------------------------------------------------


def proxy_echo(socket: str, **env: str) -> subprocess.CompletedProcess:
    """Spawn mode with a program that makes no CUDA call: it prints the socket path it was given."""
    e = emulator_env()
    for name in ("RANK", "LOCAL_RANK"):
        e.pop(name, None)
    e.update(env)
    return subprocess.run([str(PROXY), "--socket", socket, "--", "sh", "-c", 'echo "$JITCKPT_PROXY_SOCKET"'],
                          env=e, capture_output=True, text=True, timeout=60)


def test_proxy_socket_path_substitution(built, tmp_path: Path) -> None:
    done = proxy_echo(f"{tmp_path}/r%r-l%l-%%.sock", RANK="12", LOCAL_RANK="2")
    assert done.returncode == 0 and done.stdout == f"{tmp_path}/r12-l2-%.sock\n", done.stderr
    done = proxy_echo(f"{tmp_path}/rank-%r.sock")  # RANK unset: 0
    assert done.stdout == f"{tmp_path}/rank-0.sock\n"
    for socket, env, message in (
        (f"{tmp_path}/%x.sock", {}, "unknown %-sequence '%x'"),
        (f"{tmp_path}/end%", {}, "a lone % at the end"),
        (f"{tmp_path}/%r.sock", {"RANK": "-1"}, "RANK=-1 is not a rank"),
        ("/tmp/" + "a" * 98 + "%r%r", {"RANK": "1234"}, "longer than a Unix socket address allows (107 bytes"),
    ):
        done = proxy_echo(socket, **env)
        assert done.returncode == 2 and message in done.stderr and done.stdout == "", (socket, done.stderr)


def test_torchrun_workers_each_get_their_own_socket(built, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "--no-python", str(PROXY), "--socket", f"{tmp_path}/rank-%r.sock", "--",
                           "sh", "-c", 'echo "rank $RANK socket $JITCKPT_PROXY_SOCKET"'],
                          env=emulator_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        assert f"rank {rank} socket {tmp_path}/rank-{rank}.sock" in proc.stdout


# ---- end to end ------------------------------------------------------------------------------------


def checksums(output: str) -> dict[int, str]:
    return {int(r): c for r, c in re.findall(r"\[rank (\d+)\] final parameters checksum ([0-9a-f]{16})", output)}


def test_cuda_mlp_three_ranks_through_jit_run_transparent(built, tmp_path: Path) -> None:
    """3 ranks, each behind its own proxy, end with the checksum of the same run without jitckpt."""
    args = ["--standalone", "--nproc_per_node", "3", "--no-python", str(MLP), "--steps", "20"]
    (tmp_path / "plain").mkdir()
    plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", *args, "--rendezvous-dir",
                            str(tmp_path / "plain")], env=emulator_env(), capture_output=True, text=True,
                           timeout=TIMEOUT, cwd=REPO)
    assert plain.returncode == 0, plain.stderr
    want = checksums(plain.stdout)
    assert sorted(want) == [0, 1, 2] and len(set(want.values())) == 1

    (tmp_path / "transparent").mkdir()
    env = no_emulator_env(JITCKPT_SIMDEV_KERNELS=str(TWINS), JITCKPT_REMOTE_LOG_TRACE="1")
    result = jit_run("--transparent", "--emulated-gpus", "3", "torchrun", *args, "--rendezvous-dir",
                     str(tmp_path / "transparent"), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert checksums(result.stdout) == want
    cudart, nccl, line = proxy_line(result.stderr)
    assert Path(cudart) == (EMULATOR_BUILD / "libcudart.so.13").resolve(), line
    assert nccl is not None and Path(nccl) == (EMULATOR_BUILD / "libnccl.so.2").resolve(), line
    assert "(both the CPU device emulator: --emulated-gpus 3)" in line
    start = re.search(r"\[jit-run\] transparent mode: native program .*mlp, .*sockets in (\S+)\); launching torchrun",
                      result.stderr)
    assert start, result.stderr
    assert not Path(start.group(1)).exists()  # the private directory is gone
    # every rank ran behind its own proxy: three workers with the remote library's call log
    assert len(set(re.findall(r"jitckpt remote\[(\d+)\]", result.stderr))) == 3, result.stderr


def test_a_hung_all_reduce_is_recovered_under_jit_run_transparent(built, tmp_path: Path) -> None:
    """jit-run's environment is all the remote library's recovery needs (JITCKPT_PYTHON, the package on
    PYTHONPATH for the rendezvous, torchrun's store); --hang-timeout reaches it.  The recovery itself is
    proxy_server/README.md's: tests/test_proxy_recovery.py covers its cases."""
    args = ["--standalone", "--nproc_per_node", "3", "--no-python", str(MLP), "--steps", "30"]
    (tmp_path / "plain").mkdir()
    plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", *args, "--rendezvous-dir",
                            str(tmp_path / "plain")], env=emulator_env(), capture_output=True, text=True,
                           timeout=TIMEOUT, cwd=REPO)
    want = checksums(plain.stdout)
    assert plain.returncode == 0 and len(want) == 3, plain.stderr
    (tmp_path / "faulty").mkdir()
    env = no_emulator_env(JITCKPT_SIMDEV_KERNELS=str(TWINS),
                          JITCKPT_SIMDEV_FAULT="rank=1,op=ncclAllReduce,call=9,kind=hang")
    env.pop("JITCKPT_HANG_TIMEOUT", None)
    result = jit_run("--transparent", "--emulated-gpus", "3", "--hang-timeout", "2", "torchrun", *args,
                     "--rendezvous-dir", str(tmp_path / "faulty"), env=env)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert checksums(result.stdout) == want, out[-6000:]
    assert "within JITCKPT_HANG_TIMEOUT=2 s" in out
    assert sorted(re.findall(r"rank (\d): recovered in", out)) == ["0", "1", "2"], out[-6000:]
