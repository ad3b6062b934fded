"""``python -m jitckpt.transparent.rendezvous --generation G``: every rank's token, through torchrun's store.

During a recovery, transparent mode's worker library (``libjitckpt_remote.so``)
runs this once per rank (``$JITCKPT_PYTHON -m jitckpt.transparent.rendezvous``)
to learn what every other rank reported.  The contract, exactly:

- **environment**: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
  (as torchrun sets them for its workers), ``TORCHELASTIC_RUN_ID`` and
  ``TORCHELASTIC_RESTART_COUNT`` (optional; default ``none`` and ``0``),
  ``JITCKPT_TRANSPARENT_RDZV_TIMEOUT`` (seconds, default 120: the whole
  rendezvous, reaching the store included).
- **stdin**: one line, this rank's report: a token of printable ASCII without
  whitespace, at most 8192 bytes, newline-terminated.
- It connects to torchrun's store as a client (``store_client.StoreClient``,
  or ``torch.distributed.TCPStore(MASTER_ADDR, int(MASTER_PORT),
  is_master=False, timeout=timedelta(seconds=timeout))``), sets the key
  ``jitckpt/transparent/{run_id}/{restart_count}/{generation}/{rank}`` to the
  token, waits for the keys of all ``WORLD_SIZE`` ranks of the same
  generation, and prints on stdout exactly ``WORLD_SIZE`` lines
  ``RANK TOKEN``, sorted by rank; exit status 0.
- **errors**: exit status 2 for bad arguments, environment or report; 3 for a
  timeout (the message names the ranks that did not report); 4 when the
  store cannot be reached (or is lost).  Every message goes to stderr,
  prefixed ``jitckpt transparent rendezvous: ``.

The store is the one torchrun's agent hosts for its workers (torch >= 2.4
shares the rendezvous store with them; ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
would leave ``MASTER_PORT`` to a store that the workers' rank 0 creates, which
a native program never does).  Keys are never deleted: each recovery uses a
new generation, and each torchrun restart a new restart count.

It speaks the store's protocol itself (``store_client.py``), so a recovery's
rendezvous costs Python's start and a few round trips, not ``import torch``
(1.5-2.5 s on the 2-core test machine); torch's own ``TCPStore`` client is
the fallback for a store that answers that client's protocol check
otherwise.  Nothing heavy is imported, and the arguments, environment and
report are checked first, so bad input fails at once.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, BinaryIO, Callable, Mapping, Optional, Sequence, TextIO

from jitckpt.config import ENV_TRANSPARENT_RDZV_TIMEOUT
from jitckpt.transparent.store_client import StoreClient, StoreProtocolError, StoreTimeout

PREFIX = "jitckpt transparent rendezvous: "
EXIT_OK, EXIT_USAGE, EXIT_TIMEOUT, EXIT_UNREACHABLE = 0, 2, 3, 4
#: The longest report token, in bytes.
MAX_TOKEN = 8192
ENV_TIMEOUT = ENV_TRANSPARENT_RDZV_TIMEOUT
DEFAULT_TIMEOUT = 120.0
KEY_PREFIX = "jitckpt/transparent"
USAGE = ("usage: python -m jitckpt.transparent.rendezvous --generation G  "
         "(reads this rank's token on stdin, prints every rank's; environment: RANK, WORLD_SIZE, MASTER_ADDR, "
         f"MASTER_PORT, optional TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, {ENV_TIMEOUT})")
_TOKEN = re.compile(rb"[\x21-\x7e]+")


class RendezvousError(Exception):
    """A failure with its exit status (``EXIT_USAGE``, ``EXIT_TIMEOUT``, ``EXIT_UNREACHABLE``) and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Settings:
    """Everything one rank's rendezvous needs, read from its arguments and environment."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    run_id: str
    restart_count: str
    generation: int
    timeout: float

    def key(self, rank: int) -> str:
        """The store key of ``rank``'s report in this generation."""
        return f"{KEY_PREFIX}/{self.run_id}/{self.restart_count}/{self.generation}/{rank}"


def parse_generation(argv: Sequence[str]) -> int:
    """The ``--generation G`` argument (a non-negative integer); RendezvousError(2) otherwise."""
    args = list(argv)
    value: Optional[str] = None
    if len(args) == 2 and args[0] == "--generation":
        value = args[1]
    elif len(args) == 1 and args[0].startswith("--generation="):
        value = args[0].partition("=")[2]
    if value is None:
        raise RendezvousError(EXIT_USAGE, f"bad arguments {' '.join(args) or '(none)'!r}; {USAGE}")
    if not value.isascii() or not value.isdigit():
        raise RendezvousError(EXIT_USAGE, f"--generation must be a non-negative integer (got {value!r})")
    return int(value)


def _integer(environ: Mapping[str, str], name: str, low: int, high: Optional[int] = None,
             default: Optional[str] = None) -> int:
    raw = environ.get(name, default)
    if raw is None or raw == "":
        raise RendezvousError(EXIT_USAGE, f"{name} is not set (torchrun sets it for its workers)")
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or int(text) < low or (high is not None and int(text) > high):
        bounds = f"{low}..{high}" if high is not None else f">= {low}"
        raise RendezvousError(EXIT_USAGE, f"{name}={raw!r} is not an integer {bounds}")
    return int(text)


def read_settings(generation: int, environ: Mapping[str, str]) -> Settings:
    """The settings from the environment (see the module docstring); RendezvousError(2) for bad values."""
    world_size = _integer(environ, "WORLD_SIZE", 1)
    rank = _integer(environ, "RANK", 0, world_size - 1)
    master_addr = environ.get("MASTER_ADDR", "").strip()
    if not master_addr:
        raise RendezvousError(EXIT_USAGE, "MASTER_ADDR is not set (torchrun sets it for its workers)")
    master_port = _integer(environ, "MASTER_PORT", 1, 65535)
    run_id = environ.get("TORCHELASTIC_RUN_ID", "") or "none"
    if not _TOKEN.fullmatch(run_id.encode("ascii", "replace")) or "/" in run_id:
        raise RendezvousError(EXIT_USAGE, f"TORCHELASTIC_RUN_ID={run_id!r}: expected printable ASCII without "
                                          "whitespace or '/'")
    restart_count = str(_integer(environ, "TORCHELASTIC_RESTART_COUNT", 0, default="0"))
    raw_timeout = environ.get(ENV_TIMEOUT, "")
    try:
        timeout = float(raw_timeout) if raw_timeout.strip() else DEFAULT_TIMEOUT
    except ValueError:
        timeout = -1.0
    if not (0 < timeout < 1e7):  # also rejects nan and inf
        raise RendezvousError(EXIT_USAGE, f"{ENV_TIMEOUT}={raw_timeout!r} is not a positive number of seconds")
    return Settings(rank, world_size, master_addr, master_port, run_id, restart_count, generation, timeout)


def read_token(stream: BinaryIO) -> str:
    """This rank's report from ``stream``: one newline-terminated line; RendezvousError(2) if it is not a token."""
    line = stream.readline(MAX_TOKEN + 2)
    if not line:
        raise RendezvousError(EXIT_USAGE, "no report on stdin (expected one line: this rank's token)")
    if not line.endswith(b"\n"):
        if len(line) > MAX_TOKEN:
            raise RendezvousError(EXIT_USAGE, f"the report is longer than {MAX_TOKEN} bytes")
        raise RendezvousError(EXIT_USAGE, "the report does not end with a newline (a truncated write?)")
    token = line[:-1]
    if len(token) > MAX_TOKEN:
        raise RendezvousError(EXIT_USAGE, f"the report is longer than {MAX_TOKEN} bytes ({len(token)})")
    if not token:
        raise RendezvousError(EXIT_USAGE, "the report is an empty line")
    if not _TOKEN.fullmatch(token):
        bad = next(b for b in token if not 0x21 <= b <= 0x7e)
        raise RendezvousError(EXIT_USAGE, f"the report holds byte 0x{bad:02x}: a token is printable ASCII "
                                          "without whitespace")
    return token.decode("ascii")


def _gist(error: BaseException) -> str:
    """The first line of a torch store error, without its C++ source location."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text)


def _store_class() -> Callable[..., Any]:
    # c10d's own log lines (retries, stack traces) would reach stderr unprefixed.
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    from torch.distributed import TCPStore

    return TCPStore


def _where(settings: Settings) -> str:
    return f"torchrun's store at {settings.master_addr}:{settings.master_port}"


def _timed_out(settings: Settings, missing: list[int]) -> RendezvousError:
    named = ", ".join(str(r) for r in missing)
    return RendezvousError(
        EXIT_TIMEOUT,
        f"timed out after {settings.timeout:g}s: rank{'s' if len(missing) > 1 else ''} {named} of "
        f"{settings.world_size} did not report (generation {settings.generation}, restart "
        f"{settings.restart_count}, run {settings.run_id})")


def _reports(values: Sequence[Any]) -> list[tuple[int, str]]:
    out = []
    for rank, value in enumerate(values):
        text = bytes(value).decode("ascii", "replace")
        if not _TOKEN.fullmatch(text.encode("ascii", "replace")) or len(text) > MAX_TOKEN:
            raise RendezvousError(EXIT_USAGE, f"rank {rank}'s report in the store is not a token ({text[:40]!r})")
        out.append((rank, text))
    return out


def _os_gist(error: BaseException) -> str:
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


def exchange_plain(settings: Settings, token: str) -> list[tuple[int, str]]:
    """``exchange`` through ``store_client`` (no torch); StoreProtocolError if the store speaks another protocol."""
    deadline = time.monotonic() + settings.timeout
    where = _where(settings)
    try:
        client = StoreClient(settings.master_addr, settings.master_port, settings.timeout)
    except (OSError, EOFError) as exc:
        raise RendezvousError(EXIT_UNREACHABLE, f"cannot reach {where}: {_os_gist(exc)}") from None
    keys = [settings.key(rank) for rank in range(settings.world_size)]
    step = "handing in rank %d's report" % settings.rank
    try:
        client.set(keys[settings.rank], token.encode("ascii"))
        step = "waiting for the other ranks"
        try:
            client.wait(keys, max(deadline - time.monotonic(), 0.001))
        except StoreTimeout:
            missing = [rank for rank, key in enumerate(keys) if not client.check([key])]
            if missing:  # (none missing: they all arrived just after the wait gave up)
                raise _timed_out(settings, missing) from None
        step = "reading the reports"
        return _reports(client.multi_get(keys))
    except (OSError, EOFError, StoreProtocolError) as exc:
        raise RendezvousError(EXIT_UNREACHABLE, f"lost {where} while {step}: {_os_gist(exc)}") from None
    finally:
        client.close()


def exchange(settings: Settings, token: str, store_class: Optional[Callable[..., Any]] = None) -> list[tuple[int, str]]:
    """Hand in ``token`` and return every rank's ``(rank, token)``, sorted; RendezvousError(3 or 4) on failure.

    Through ``store_client`` unless ``store_class`` is given; torch's own
    ``TCPStore`` client when the store does not answer that client's
    protocol check (another torch version's protocol)."""
    if store_class is None:
        try:
            return exchange_plain(settings, token)
        except StoreProtocolError as exc:
            print(f"{PREFIX}the store does not speak the protocol jitckpt's own client knows ({exc}); "
                  "using torch's TCPStore client", file=sys.stderr, flush=True)
    deadline = time.monotonic() + settings.timeout
    where = _where(settings)
    store_class = _store_class() if store_class is None else store_class
    try:
        store = store_class(settings.master_addr, settings.master_port, is_master=False,
                            timeout=timedelta(seconds=settings.timeout))
    except Exception as exc:  # DistNetworkError, DistStoreError, RuntimeError, ValueError (a bad host name)
        raise RendezvousError(EXIT_UNREACHABLE, f"cannot reach {where}: {_gist(exc)}") from None
    keys = [settings.key(rank) for rank in range(settings.world_size)]
    try:
        store.set(keys[settings.rank], token)
    except Exception as exc:
        raise RendezvousError(EXIT_UNREACHABLE, f"lost {where} while handing in rank {settings.rank}'s report: "
                                                f"{_gist(exc)}") from None
    remaining = max(deadline - time.monotonic(), 0.001)
    try:
        store.wait(keys, timedelta(seconds=remaining))
    except Exception as exc:
        if type(exc).__name__ != "DistStoreError" and "timeout" not in str(exc).lower():
            raise RendezvousError(EXIT_UNREACHABLE, f"lost {where} while waiting for the other ranks: "
                                                    f"{_gist(exc)}") from None
        try:
            missing = [rank for rank, key in enumerate(keys) if not store.check([key])]
        except Exception as check_exc:
            raise RendezvousError(EXIT_UNREACHABLE, f"lost {where} while waiting for the other ranks: "
                                                    f"{_gist(check_exc)}") from None
        if missing:  # (none missing: they all arrived just after the wait gave up)
            raise _timed_out(settings, missing) from None
    try:
        values = store.multi_get(keys) if hasattr(store, "multi_get") else [store.get(k) for k in keys]
    except Exception as exc:
        raise RendezvousError(EXIT_UNREACHABLE, f"lost {where} while reading the reports: {_gist(exc)}") from None
    return _reports(values)


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None,
         stdin: Optional[BinaryIO] = None, stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None) -> int:
    """Run one rank's rendezvous; returns the exit status (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    stdin = sys.stdin.buffer if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    if list(argv) in (["-h"], ["--help"]):
        print(USAGE, file=stdout)
        return EXIT_OK
    try:
        settings = read_settings(parse_generation(argv), environ)
        token = read_token(stdin)
        reports = exchange(settings, token)
    except RendezvousError as exc:
        print(PREFIX + str(exc), file=stderr, flush=True)
        return exc.status
    stdout.write("".join(f"{rank} {text}\n" for rank, text in reports))
    stdout.flush()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
