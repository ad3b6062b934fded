"""What the CUDA runtime and NCCL headers cannot tell the interposer generator.

``gen_interpose.py`` reads every prototype (return type, parameter types and
names) from ``cuda_runtime_api.h`` and ``nccl.h``, and the per-thread default
stream names (``cudaMemcpy_ptds``, ``cudaEventRecord_ptsz``) from the
header's ``__CUDART_API_PTDS``/``__CUDART_API_PTSZ`` lines.  This table adds
the facts about a function that no header states.  It is the one description
of the API that the passthrough library is generated from today, and that the
remote (transparent-mode) stubs and the device proxy's dispatch are to be
generated from later.

Format
------
``FACTS`` maps a function's plain name (never its ``_ptsz``/``_ptds`` twin: a
fact about ``cudaMemcpy`` holds for ``cudaMemcpy_ptds`` too) to a ``Fact``.
A function the table does not name binds straight to the real library in
passthrough mode ("forwarded").  Every name in the table must be declared by
its header, or carry ``prototype=``; every parameter name the table uses must
be one of the prototype's.  The generator stops with the function's name
otherwise.

Passthrough mode (generated now):

``hook``
    The function is *wrapped*: its exported entry point (every default-stream
    flavour the header declares) calls ``hook_<hook>(next, <needs>...,
    <parameters>..., ptds)`` in ``src/hooks.h`` and returns its result.
    ``next`` is the real function (never NULL: the entry point returns the
    library's "symbol not found" error first), ``ptds`` is 1 in the
    ``_ptsz``/``_ptds`` flavour, where stream 0 is the per-thread stream.
``needs``
    Companion functions whose real definitions the hook also receives, in the
    same default-stream flavour (``cudaMemcpy_ptds`` gets
    ``cudaMemcpyAsync_ptsz``), each possibly NULL.
``before``, ``before_args``
    The function is wrapped, and forwarded unchanged after
    ``hook_<before>(<before_args>...)`` ran (bookkeeping only).
``lookup``
    Not wrapped, but the library calls the real function itself through
    ``next_<name>`` (the plain flavour only).
``prototype``, ``per_thread``
    For a function no header declares (nvcc's ``__cudaLaunchKernel``): its C
    prototype, and the name of its per-thread-default-stream twin, if any.

Transparent (remote) mode (descriptive columns, not generated from yet):

``handles``
    Parameter -> kind of the handle it passes in (``stream``, ``event``,
    ``comm``, ``kernel``, ``func``, ``graph``, ``graph_exec``): the worker
    holds virtual handles, the proxy real ones.
``creates``, ``destroys``
    Output parameter -> kind of the handle the call creates; parameters whose
    handle the call destroys.
``outputs``
    Other pointer parameters the call writes, copied back to the caller.
``mode``
    ``"sync"``: returns when done; ``"async"``: enqueued on a stream, the call
    returns at once and the proxy runs it in order; ``"blocking"``: waits for
    device work (a synchronisation, or a copy into pageable memory).
``log_bytes``
    Parameter -> C expression over the parameters: how many bytes of host
    memory it points to that the call log must keep for replay (0 when none).
``refused``
    Transparent mode refuses the call, for this reason (told to the user by
    ``jit-run doctor`` and at run time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Fact:
    """The facts about one function that its header does not state (see the module docstring)."""

    # passthrough mode
    hook: str = ""
    needs: tuple[str, ...] = ()
    before: str = ""
    before_args: tuple[str, ...] = ()
    lookup: bool = False
    prototype: str = ""
    per_thread: str = ""
    # transparent mode
    handles: Mapping[str, str] = field(default_factory=dict)
    creates: Mapping[str, str] = field(default_factory=dict)
    destroys: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    mode: str = ""
    log_bytes: Mapping[str, str] = field(default_factory=dict)
    refused: str = ""

    @property
    def wrapped(self) -> bool:
        return bool(self.hook or self.before)


STREAM = {"stream": "stream"}
H2D = "kind == cudaMemcpyHostToDevice"
NO_GRAPHS = "CUDA graphs: captured work would bypass transparent mode's call log and replay"

CUDART: dict[str, Fact] = {
    # events and stream waits: the watch-list (event_watch.c)
    "cudaEventRecord": Fact(hook="event_record", handles={"event": "event", **STREAM}, mode="async"),
    "cudaEventRecordWithFlags": Fact(hook="event_record_flags", handles={"event": "event", **STREAM},
                                     mode="async"),
    "cudaStreamWaitEvent": Fact(hook="stream_wait_event", handles={"stream": "stream", "event": "event"},
                                mode="async"),
    "cudaEventSynchronize": Fact(hook="event_synchronize", handles={"event": "event"}, mode="blocking"),
    "cudaEventDestroy": Fact(before="event_destroy", before_args=("event",), destroys=("event",), mode="sync"),
    "cudaStreamDestroy": Fact(before="stream_destroy", before_args=("stream",), destroys=("stream",),
                              mode="sync"),
    # calls that can block the host: the GIL release (gil_release.c); save-time redirection (redirect.c)
    "cudaStreamSynchronize": Fact(hook="stream_synchronize", handles=STREAM, mode="blocking"),
    "cudaDeviceSynchronize": Fact(hook="device_synchronize", mode="blocking"),
    "cudaMemcpy": Fact(hook="memcpy", needs=("cudaMemcpyAsync", "cudaStreamSynchronize"), mode="blocking",
                       log_bytes={"src": f"{H2D} ? count : 0"}),
    "cudaMemcpyAsync": Fact(hook="memcpy_async", handles=STREAM, mode="async",
                            log_bytes={"src": f"{H2D} ? count : 0"}),
    "cudaMemcpy2D": Fact(hook="memcpy2d", needs=("cudaMemcpy2DAsync", "cudaStreamSynchronize"),
                         mode="blocking",
                         log_bytes={"src": f"{H2D} && height ? spitch * (height - 1) + width : 0"}),
    "cudaMemcpy2DAsync": Fact(hook="memcpy2d_async", handles=STREAM, mode="async",
                              log_bytes={"src": f"{H2D} && height ? spitch * (height - 1) + width : 0"}),
    "cudaMemset": Fact(hook="memset", needs=("cudaMemsetAsync",), mode="sync"),
    "cudaMemsetAsync": Fact(hook="memset_async", handles=STREAM, mode="async"),
    # kernel launches (kernel arguments are logged by the launch itself: their sizes come from the fatbinary)
    "cudaLaunchKernel": Fact(hook="launch", handles={"func": "func", **STREAM}, mode="async"),
    "cudaLaunchKernelExC": Fact(hook="launch_ex", handles={"func": "func"}, mode="async"),
    "__cudaLaunchKernel": Fact(
        hook="launch_hidden", handles={"kernel": "kernel", **STREAM}, mode="async",
        prototype="cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, "
                  "void **args, size_t sharedMem, cudaStream_t stream)",
        per_thread="__cudaLaunchKernel_ptsz"),
    # graph capture and graphs (capture.c).  Transparent mode cannot put graphs in its call log yet.
    "cudaStreamBeginCapture": Fact(hook="capture_begin", handles=STREAM, mode="sync", refused=NO_GRAPHS),
    "cudaStreamBeginCaptureToGraph": Fact(hook="capture_begin_to_graph", handles={"graph": "graph", **STREAM},
                                          mode="sync", refused=NO_GRAPHS),
    "cudaStreamEndCapture": Fact(hook="capture_end", handles=STREAM, creates={"pGraph": "graph"}, mode="sync",
                                 refused=NO_GRAPHS),
    "cudaGraphInstantiate": Fact(hook="graph_instantiate", handles={"graph": "graph"},
                                 creates={"pGraphExec": "graph_exec"}, mode="sync", refused=NO_GRAPHS),
    "cudaGraphInstantiateWithFlags": Fact(hook="graph_instantiate", handles={"graph": "graph"},
                                          creates={"pGraphExec": "graph_exec"}, mode="sync", refused=NO_GRAPHS),
    "cudaGraphInstantiateWithParams": Fact(hook="graph_instantiate_params", handles={"graph": "graph"},
                                           creates={"pGraphExec": "graph_exec"}, outputs=("instantiateParams",),
                                           mode="sync", refused=NO_GRAPHS),
    "cudaGraphLaunch": Fact(hook="graph_launch", needs=("cudaEventRecord",),
                            handles={"graphExec": "graph_exec", **STREAM}, mode="async", refused=NO_GRAPHS),
    "cudaGraphExecDestroy": Fact(before="graph_exec_forget", before_args=("graphExec",), destroys=("graphExec",),
                                 mode="sync", refused=NO_GRAPHS),
    "cudaGraphDestroy": Fact(before="graph_forget", before_args=("graph",), destroys=("graph",), mode="sync",
                             refused=NO_GRAPHS),
    # called by the library itself (watchdog.c, redirect.c, event_watch.c, capture.c)
    "cudaStreamGetCaptureInfo": Fact(lookup=True, handles=STREAM, mode="sync",
                                     outputs=("captureStatus_out", "id_out", "graph_out", "dependencies_out",
                                              "edgeData_out", "numDependencies_out")),
    "cudaThreadExchangeStreamCaptureMode": Fact(lookup=True, outputs=("mode",), mode="sync"),
    "cudaEventCreateWithFlags": Fact(lookup=True, creates={"event": "event"}, mode="sync"),
    "cudaEventQuery": Fact(lookup=True, handles={"event": "event"}, mode="sync"),
    "cudaGetDevice": Fact(lookup=True, outputs=("device",), mode="sync"),
    "cudaSetDevice": Fact(lookup=True, mode="sync"),
    "cudaStreamCreateWithFlags": Fact(lookup=True, creates={"pStream": "stream"}, mode="sync"),
    "cudaStreamGetFlags": Fact(lookup=True, handles={"hStream": "stream"}, outputs=("flags",), mode="sync"),
    # refused in transparent mode
    "cudaGetDriverEntryPoint": Fact(
        refused="hands out driver API entry points, which bypass runtime interposition"),
    "cudaGetDriverEntryPointByVersion": Fact(
        refused="hands out driver API entry points, which bypass runtime interposition"),
}

# NCCL calls that enqueue work on a stream: the stream becomes an NCCL stream
# (nccl_streams.c).  Real NCCL drives the GPU through the driver API, so the
# work NCCL itself puts on the stream never passes through the interposer.
# Its communicator becomes one whose asynchronous error the watchdog polls (nccl_comms.c).
NCCL_ENQUEUE = Fact(before="nccl_enqueue", before_args=("comm", "stream"), handles={"comm": "comm", **STREAM},
                    mode="async")
NCCL: dict[str, Fact] = {name: NCCL_ENQUEUE for name in (
    "ncclAllReduce", "ncclBroadcast", "ncclBcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter",
    "ncclAlltoAll", "ncclGather", "ncclScatter", "ncclSend", "ncclRecv",
    "ncclAllReduceConfig", "ncclBroadcastConfig", "ncclReduceConfig", "ncclAllGatherConfig",
    "ncclReduceScatterConfig", "ncclAlltoAllConfig", "ncclGatherConfig", "ncclScatterConfig",
)}
# The watchdog stops polling a communicator before it is freed.
NCCL_COMM_GONE = Fact(before="nccl_comm_forget", before_args=("comm",), handles={"comm": "comm"},
                      destroys=("comm",), mode="sync")
NCCL.update({
    "ncclCommDestroy": NCCL_COMM_GONE,
    "ncclCommAbort": NCCL_COMM_GONE,
    # called by the watchdog itself (nccl_comms.c)
    "ncclCommGetAsyncError": Fact(lookup=True, handles={"comm": "comm"}, outputs=("asyncError",), mode="sync"),
    "ncclGetErrorString": Fact(lookup=True, mode="sync"),
    "ncclGetLastError": Fact(lookup=True, handles={"comm": "comm"}, mode="sync"),
})

FACTS: dict[str, Fact] = {**CUDART, **NCCL}
