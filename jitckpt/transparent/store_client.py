"""A client of torchrun's store (torch's ``TCPStore``) that does not import torch.

A transparent recovery meets the other ranks through torchrun's store
(``rendezvous.py``).  ``import torch`` for its ``TCPStore`` class took 1.5-2.5 s
of every recovery on the 2-core test machine, most of the recovery's time;
this client speaks the store's wire protocol itself, with the socket module:

- every request is a query type byte followed by its arguments; strings are a
  little-endian ``uint64`` length and the bytes; a key is sent with the
  ``"/"`` prefix ``TCPStore`` puts before every key;
- a connection starts with ``VALIDATE`` (the magic number ``0x3C85F7CE``) and
  a ``PING`` whose nonce the server must echo: a server that does not is
  taken to speak another version of the protocol (``StoreProtocolError``),
  and the caller falls back to torch's own client;
- ``SET key value``; ``CHECK n keys`` answers one byte (0: all present);
  ``WAIT n keys`` answers ``STOP_WAITING`` (0) once all are present, and is
  given up with ``CANCEL_WAIT``, answered ``WAIT_CANCELED`` (1) (after a
  ``STOP_WAITING`` that crossed it); ``MULTI_GET n keys`` answers each value.

Checked against torch 2.13's server by ``tests/test_transparent_rendezvous.py``,
which also runs the fallback.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Sequence

VALIDATE, SET, GET, CHECK, WAIT, MULTI_GET, CANCEL_WAIT, PING = 0, 1, 3, 5, 6, 10, 12, 13
MAGIC = 0x3C85F7CE
READY, STOP_WAITING, WAIT_CANCELED = 0, 0, 1
KEY_PREFIX = "/"
MAX_VALUE = 1 << 20


class StoreProtocolError(Exception):
    """The server's answers are not those of the protocol this client speaks."""


class StoreTimeout(Exception):
    """A wait ran out of time."""


def _string(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


class StoreClient:
    """One connection to a TCPStore server; ``OSError`` when it cannot be reached or is lost."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:  # the server may not listen yet (as TCPStore's client, keep trying until the timeout)
            try:
                self._sock = socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.05))
                break
            except (ConnectionRefusedError, ConnectionResetError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._timeout = timeout
        self._send(bytes([VALIDATE]) + struct.pack("<I", MAGIC))
        nonce = (os.getpid() ^ time.monotonic_ns()) & 0xFFFFFFFF
        self._send(bytes([PING]) + struct.pack("<I", nonce))
        try:
            echoed = struct.unpack("<I", self._recv(4, timeout))[0]
        except (EOFError, socket.timeout) as exc:
            raise StoreProtocolError(f"no answer to PING ({exc or type(exc).__name__})") from None
        if echoed != nonce:
            raise StoreProtocolError(f"PING answered {echoed:#x}, not the nonce {nonce:#x}")

    def close(self) -> None:
        self._sock.close()

    def _send(self, data: bytes) -> None:
        self._sock.settimeout(self._timeout)
        self._sock.sendall(data)

    def _recv(self, n: int, timeout: float) -> bytes:
        self._sock.settimeout(max(timeout, 0.001))
        out = bytearray()
        while len(out) < n:
            chunk = self._sock.recv(n - len(out))
            if not chunk:
                raise EOFError("the store closed the connection")
            out += chunk
        return bytes(out)

    def _keys(self, query: int, keys: Sequence[str]) -> bytes:
        return bytes([query]) + struct.pack("<Q", len(keys)) + b"".join(
            _string((KEY_PREFIX + k).encode()) for k in keys)

    def set(self, key: str, value: bytes) -> None:
        self._send(bytes([SET]) + _string((KEY_PREFIX + key).encode()) + _string(value))

    def check(self, keys: Sequence[str]) -> bool:
        """True if every key is present."""
        self._send(self._keys(CHECK, keys))
        answer = self._recv(1, self._timeout)[0]
        if answer not in (0, 1):
            raise StoreProtocolError(f"CHECK answered {answer}")
        return answer == READY

    def wait(self, keys: Sequence[str], timeout: float) -> None:
        """Returns once every key is present; StoreTimeout after ``timeout`` seconds."""
        self._send(self._keys(WAIT, keys))
        try:
            answer = self._recv(1, timeout)[0]
        except socket.timeout:
            self._send(bytes([CANCEL_WAIT]))
            answer = self._recv(1, self._timeout)[0]
            if answer == STOP_WAITING:            # it crossed the cancellation: the cancellation is answered too
                answer = self._recv(1, self._timeout)[0]
                if answer != WAIT_CANCELED:
                    raise StoreProtocolError(f"CANCEL_WAIT answered {answer}") from None
            elif answer != WAIT_CANCELED:
                raise StoreProtocolError(f"CANCEL_WAIT answered {answer}") from None
            raise StoreTimeout(f"waited {timeout:g}s") from None
        if answer != STOP_WAITING:
            raise StoreProtocolError(f"WAIT answered {answer}")

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        self._send(self._keys(MULTI_GET, keys))
        values = []
        for _ in keys:
            n = struct.unpack("<Q", self._recv(8, self._timeout))[0]
            if n > MAX_VALUE:
                raise StoreProtocolError(f"a value of {n} bytes")
            values.append(self._recv(n, self._timeout))
        return values
