"""JIT events: why a worker stops training and saves at once.

Three different things are called "event" in this project; each has one name:

- a **JIT event** (this module): a failure the worker reacts to by saving,
  with a ``JitReason``;
- the **event log** (``jitckpt.eventlog``): JSON records of what every process
  saw, read back for the recovery report;
- a **CUDA event** (``cudaEvent_t``): what the interposer's C watchdog polls
  behind NCCL kernels (``jitckpt.native.interposer``, ``interpose/``).
"""

from __future__ import annotations

import enum


class JitReason(str, enum.Enum):
    """Why a JIT event was raised; the value is what the event log and the report show."""

    #: A tracked torch.distributed collective stayed in flight past the hang timeout.
    HANG = "hang"
    #: torchrun's agent sent SIGTERM (a peer failed, or the job was cancelled).
    SIGTERM = "sigterm"
    #: A collective failed, or the script died of an error a lost peer causes.
    PEER_ERROR = "peer-error"
    #: The interposer's C watchdog saw a CUDA event behind an NCCL kernel never complete.
    CUDA_HANG = "cuda-hang"
    #: The interposer saw a CUDA error while watching NCCL work.
    CUDA_ERROR = "cuda-error"
    #: The interposer saw a communicator's asynchronous NCCL error (ncclCommGetAsyncError), e.g. a failed peer.
    NCCL_ERROR = "nccl-error"

    def __str__(self) -> str:
        return self.value

    @property
    def from_device(self) -> bool:
        """True for reasons the C watchdog raises from device (stream) state rather than Python frames."""
        return self in (JitReason.CUDA_HANG, JitReason.CUDA_ERROR)
