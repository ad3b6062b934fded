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
``since``
    For an NCCL function newer than the oldest ``nccl.h`` the native parts
    build against (2.27): the NCCL version that added it (``"2.28"``).  Built
    against an older header, the function is left out of that build:
    passthrough mode forwards it unchanged, transparent mode refuses it by name
    with that reason.  The generator checks the version against the header
    (an older header that declares it, or a newer one that does not, stops it).

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

Remote mode (generated into ``libjitckpt_remote.so`` and the proxy's
dispatch, ``gen_interpose.py --remote``; see ``proxy_server/README.md``):

``remote``
    ``"gen"``: the worker stub and the proxy dispatch are generated from the
    prototype and the columns here; ``"hand"``: both sides are hand-written
    (``interpose/remote/special.c``, ``proxy_server/src/special.c``);
    ``"local"``: runs in the worker against nothing remote (worker-side
    state only).  Every other function that returns ``cudaError_t`` or
    ``ncclResult_t`` is refused by name; functions returning anything else
    (``cudaGetErrorString``) are pure and call the real library in-process.
``device``
    Pointer parameters whose *value* crosses unchanged: device addresses
    (the proxy re-creates allocations at the same address) and host-stub
    addresses, which the runtime only uses as keys.
``host_in``, ``host_out``
    Parameter -> C expression over the parameters: bytes of host memory the
    call reads (copied to the proxy through the bulk arena) or writes
    (copied back from it).  When the expression is 0 the pointer's value
    crosses unchanged (it is a device address: ``cudaMemcpy``'s ``kind``).
``host_inout``
    Parameter -> C expression: a host buffer the call writes only in part
    (a 2D copy's rows): its bytes go to the proxy and come back, so the
    bytes between the rows keep their values.
``out_strings``
    ``const char **`` parameters the call points at a string: the string's
    bytes come back and the worker keeps its own copy.
``default_kind``
    ``(dst, src)`` parameter names of a copy (``""``: a symbol, device
    memory): a ``cudaMemcpyDefault`` kind is resolved in the worker from its
    device allocations (interpose/remote/copykind.c) before marshalling.
``local_h2h``
    A host-to-host copy is made in the worker after synchronising this
    stream expression (``"0"``: the legacy default stream).
``after``
    A C statement run after the call, whatever its result (``jr_ret``).
``answer_locally``
    A C expression the stub returns first when it is not ``-1``: the
    worker's own answer (cudaPointerGetAttributes of memory the proxy
    cannot see: the proxy's address space is not the worker's).
``remote_check``
    A C condition over the parameters under which remote mode refuses this
    particular call at run time (``cudaMemcpyDefault`` needs to know which
    pointers are device pointers, which the worker does not track yet).
``remote_async``
    The call is posted to the request ring and returns ``cudaSuccess``/
    ``ncclSuccess`` at once; the proxy runs it in ring order and its error
    is returned by the next synchronous call.  Only for calls with nothing
    to answer (no ``outputs``, ``creates``, ``out_strings``); one that puts
    bytes in a ``host_out`` buffer (a copy into host memory) waits for its
    answer at run time.  Unset: the call waits (when unsure, synchronous).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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
    since: str = ""
    # transparent mode
    handles: Mapping[str, str] = field(default_factory=dict)
    creates: Mapping[str, str] = field(default_factory=dict)
    destroys: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    mode: str = ""
    log_bytes: Mapping[str, str] = field(default_factory=dict)
    refused: str = ""
    # remote mode
    remote: str = ""
    device: tuple[str, ...] = ()
    host_in: Mapping[str, str] = field(default_factory=dict)
    host_out: Mapping[str, str] = field(default_factory=dict)
    out_strings: tuple[str, ...] = ()
    remote_check: str = ""
    remote_async: bool = False
    after: str = ""
    host_inout: Mapping[str, str] = field(default_factory=dict)
    default_kind: tuple[str, ...] = ()
    local_h2h: str = ""
    answer_locally: str = ""

    @property
    def wrapped(self) -> bool:
        return bool(self.hook or self.before)


STREAM = {"stream": "stream"}
IPC = ("CUDA IPC hands device memory or an event to another process, which cannot map the device proxy's memory "
       "(PyTorch uses it for CUDA tensors sent between processes: torch.multiprocessing, DataLoader workers "
       "returning CUDA tensors)")
MEMPOOLS = ("stream-ordered memory pools are not marshalled (PyTorch's allocator backend cudaMallocAsync uses them: "
            "keep PYTORCH_CUDA_ALLOC_CONF's default backend, native)")
H2D = "kind == cudaMemcpyHostToDevice"
NO_GRAPHS = ("CUDA graphs built other than by stream capture (to an existing graph, with instantiation "
             "parameters) are not marshalled by remote mode")

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
    # graph capture and graphs (capture.c).  Transparent mode runs stream capture and graph launches
    # (REMOTE below: interpose/remote/graphs.c); the rest of graph construction it refuses.
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


# ---- remote mode: the functions milestone 1 of transparent mode marshals ----------------
# Columns as in the module docstring; merged into the rows above (or new rows).
D2H, H2D_ONLY = "kind == cudaMemcpyDeviceToHost", "kind == cudaMemcpyHostToDevice"
# cudaMemcpyDefault needs to know which pointers are device pointers; host-to-host
# would copy between worker addresses.  An invalid kind goes to the runtime, which rejects it.
NO_DEFAULT_KIND = "kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost"
GEN, HAND = "gen", "hand"
REMOTE: dict[str, dict] = {
    # device, memory
    "cudaGetDeviceCount": dict(remote=GEN, outputs=("count",), mode="sync"),
    "cudaGetDevice": dict(remote=GEN),
    "cudaSetDevice": dict(remote=GEN),
    "cudaGetDeviceProperties": dict(remote=GEN, outputs=("prop",), mode="sync"),
    "cudaDeviceGetAttribute": dict(remote=GEN, outputs=("value",), mode="sync"),
    "cudaRuntimeGetVersion": dict(remote=GEN, outputs=("runtimeVersion",), mode="sync"),
    "cudaDriverGetVersion": dict(remote=GEN, outputs=("driverVersion",), mode="sync"),
    "cudaMemGetInfo": dict(remote=GEN, outputs=("free", "total"), mode="sync"),
    "cudaDeviceSynchronize": dict(remote=GEN),
    "cudaGetLastError": dict(remote=GEN, mode="sync"),
    "cudaPeekAtLastError": dict(remote=GEN, mode="sync"),
    "cudaMalloc": dict(remote=GEN, outputs=("devPtr",), mode="sync"),
    "cudaFree": dict(remote=GEN, device=("devPtr",), mode="sync", answer_locally="remote_free_managed(devPtr)"),
    "cudaMemcpy": dict(remote=GEN, host_in={"src": f"{H2D_ONLY} ? count : 0"},
                       host_out={"dst": f"{D2H} ? count : 0"}, remote_check=NO_DEFAULT_KIND,
                       default_kind=("dst", "src"), local_h2h="0"),
    "cudaMemcpyAsync": dict(remote=GEN, host_in={"src": f"{H2D_ONLY} ? count : 0"},
                            host_out={"dst": f"{D2H} ? count : 0"}, remote_check=NO_DEFAULT_KIND,
                            default_kind=("dst", "src"), local_h2h="stream", remote_async=True),
    "cudaMemset": dict(remote=GEN, device=("devPtr",)),
    "cudaMemsetAsync": dict(remote=GEN, device=("devPtr",), remote_async=True),
    # streams and events
    "cudaStreamCreate": dict(remote=GEN, creates={"pStream": "stream"}, mode="sync"),
    "cudaStreamCreateWithFlags": dict(remote=GEN),
    "cudaStreamCreateWithPriority": dict(remote=GEN, creates={"pStream": "stream"}, mode="sync"),
    "cudaStreamDestroy": dict(remote=GEN, handles=STREAM),
    "cudaStreamSynchronize": dict(remote=GEN),
    "cudaStreamQuery": dict(remote=GEN, handles=STREAM, mode="sync"),
    "cudaStreamWaitEvent": dict(remote=GEN, remote_async=True),
    "cudaStreamGetFlags": dict(remote=GEN),
    "cudaStreamGetPriority": dict(remote=GEN, handles={"hStream": "stream"}, outputs=("priority",), mode="sync"),
    "cudaEventCreate": dict(remote=GEN, creates={"event": "event"}, mode="sync"),
    "cudaEventCreateWithFlags": dict(remote=GEN),
    "cudaEventRecord": dict(remote=GEN, remote_async=True),
    "cudaEventSynchronize": dict(remote=GEN),
    "cudaEventQuery": dict(remote=GEN),
    "cudaEventDestroy": dict(remote=GEN, handles={"event": "event"}),
    "cudaEventElapsedTime": dict(remote=GEN, handles={"start": "event", "end": "event"}, outputs=("ms",),
                                 mode="sync"),
    # kernels and device variables (keys: the worker's host-stub and host-shadow addresses)
    "cudaFuncGetName": dict(remote=GEN, device=("func",), out_strings=("name",), mode="sync"),
    "cudaFuncGetParamInfo": dict(remote=GEN, device=("func",), outputs=("paramOffset", "paramSize"), mode="sync"),
    "cudaGetSymbolAddress": dict(remote=GEN, device=("symbol",), outputs=("devPtr",), mode="sync"),
    "cudaGetSymbolSize": dict(remote=GEN, device=("symbol",), outputs=("size",), mode="sync"),
    "cudaMemcpyToSymbol": dict(remote=GEN, device=("symbol",), host_in={"src": f"{H2D_ONLY} ? count : 0"},
                               remote_check=NO_DEFAULT_KIND, default_kind=("", "src"),
                               mode="blocking"),
    "cudaMemcpyFromSymbol": dict(remote=GEN, device=("symbol",), host_out={"dst": f"{D2H} ? count : 0"},
                                 remote_check=NO_DEFAULT_KIND, default_kind=("dst", ""),
                                 mode="blocking"),
    # device queries and settings.  A setting is given back to a restarted proxy (SETTINGS in gen_remote.py).
    "cudaDeviceCanAccessPeer": dict(remote=GEN, outputs=("canAccessPeer",), mode="sync"),
    "cudaDeviceGetByPCIBusId": dict(remote=GEN, outputs=("device",), mode="sync",
                                    host_in={"pciBusId": "pciBusId ? strlen(pciBusId) + 1 : 0"}),
    "cudaDeviceGetPCIBusId": dict(remote=GEN, mode="sync", host_out={"pciBusId": "len > 0 ? (size_t)len : 0"}),
    "cudaDeviceGetCacheConfig": dict(remote=GEN, outputs=("pCacheConfig",), mode="sync"),
    "cudaDeviceSetCacheConfig": dict(remote=GEN, mode="sync"),
    "cudaDeviceGetLimit": dict(remote=GEN, outputs=("pValue",), mode="sync"),
    "cudaDeviceSetLimit": dict(remote=GEN, mode="sync"),
    "cudaDeviceGetStreamPriorityRange": dict(remote=GEN, outputs=("leastPriority", "greatestPriority"), mode="sync"),
    "cudaGetDeviceFlags": dict(remote=GEN, outputs=("flags",), mode="sync"),
    "cudaSetDeviceFlags": dict(remote=GEN, mode="sync"),
    "cudaInitDevice": dict(remote=GEN, mode="sync"),
    "cudaDeviceEnablePeerAccess": dict(remote=GEN, mode="sync"),
    "cudaDeviceDisablePeerAccess": dict(remote=GEN, mode="sync"),
    "cudaDeviceReset": dict(remote=GEN, mode="sync"),
    "cudaProfilerStart": dict(remote=GEN, mode="sync", prototype="cudaError_t cudaProfilerStart(void)"),
    "cudaProfilerStop": dict(remote=GEN, mode="sync", prototype="cudaError_t cudaProfilerStop(void)"),
    "cudaStreamGetDevice": dict(remote=GEN, handles={"hStream": "stream"}, outputs=("device",), mode="sync"),
    "cudaStreamGetId": dict(remote=GEN, handles={"hStream": "stream"}, outputs=("streamId",), mode="sync"),
    "cudaStreamIsCapturing": dict(remote=GEN, handles=STREAM, outputs=("pCaptureStatus",), mode="sync"),
    # graphs and stream capture (interpose/remote/graphs.c): run through the proxy; recovery is off
    # for a job that captures (a replay cannot redo captured work, a restart cannot re-make graphs)
    "cudaStreamBeginCapture": dict(remote=GEN, refused=""),
    "cudaStreamEndCapture": dict(remote=GEN, refused="", answer_locally="remote_capture_end_check(stream)",
                                 after="remote_capture_ended(stream, jr_ret, pGraph)"),
    "cudaGraphInstantiate": dict(remote=GEN, refused=""),
    "cudaGraphInstantiateWithFlags": dict(remote=GEN, refused=""),
    "cudaGraphLaunch": dict(remote=GEN, refused="", remote_async=True),
    "cudaGraphExecDestroy": dict(remote=GEN, refused="", handles={"graphExec": "graph_exec"}),
    "cudaGraphDestroy": dict(remote=GEN, refused="", handles={"graph": "graph"}),
    "cudaStreamGetCaptureInfo": dict(remote=HAND),
    "cudaThreadExchangeStreamCaptureMode": dict(remote=HAND),
    "cudaEventRecordWithFlags": dict(remote=GEN, remote_async=True),
    # kernels
    "cudaFuncGetAttributes": dict(remote=GEN, device=("func",), outputs=("attr",), mode="sync"),
    "cudaFuncSetAttribute": dict(remote=GEN, device=("func",), mode="sync"),
    "cudaFuncSetCacheConfig": dict(remote=GEN, device=("func",), mode="sync"),
    "cudaGetKernel": dict(remote=HAND, mode="sync"),            # __cudaGetKernel's twin (special.c)
    "cudaGetFuncBySymbol": dict(remote=GEN, creates={"functionPtr": "func"}, device=("symbolPtr",), mode="sync"),
    "cudaLaunchKernelExC": dict(remote=HAND, remote_async=True),
    # device memory: placed by the proxy in its reserved range (proxy_server/src/alloc.c), tracked for a restart
    "cudaMallocPitch": dict(remote=GEN, outputs=("devPtr", "pitch"), mode="sync"),
    "cudaMallocAsync": dict(remote=GEN, handles={"hStream": "stream"}, outputs=("devPtr",), mode="sync"),
    "cudaFreeAsync": dict(remote=GEN, handles={"hStream": "stream"}, device=("devPtr",), mode="sync"),
    "cudaPointerGetAttributes": dict(remote=GEN, device=("ptr",), outputs=("attributes",), mode="sync",
                                     answer_locally="remote_pointer_attributes_here(attributes, ptr)"),
    # 2D, peer and stream-ordered symbol copies.  A 2D copy into host memory takes the
    # destination's bytes too (host_inout): the gaps between its rows stay as they were.
    "cudaMemcpy2D": dict(remote=GEN, host_in={"src": f"{H2D_ONLY} && height ? spitch * (height - 1) + width : 0"},
                         host_inout={"dst": f"{D2H} && height ? dpitch * (height - 1) + width : 0"},
                         remote_check=NO_DEFAULT_KIND, default_kind=("dst", "src")),
    "cudaMemcpy2DAsync": dict(remote=GEN, host_in={"src": f"{H2D_ONLY} && height ? spitch * (height - 1) + width : 0"},
                              host_inout={"dst": f"{D2H} && height ? dpitch * (height - 1) + width : 0"},
                              remote_check=NO_DEFAULT_KIND, default_kind=("dst", "src"), remote_async=True),
    "cudaMemset2D": dict(remote=GEN, device=("devPtr",), mode="sync"),
    "cudaMemset2DAsync": dict(remote=GEN, device=("devPtr",), handles=STREAM, mode="async", remote_async=True),
    "cudaMemcpyPeer": dict(remote=GEN, device=("dst", "src"), mode="blocking"),
    "cudaMemcpyPeerAsync": dict(remote=GEN, device=("dst", "src"), handles=STREAM, mode="async", remote_async=True),
    "cudaMemcpyToSymbolAsync": dict(remote=GEN, device=("symbol",), host_in={"src": f"{H2D_ONLY} ? count : 0"},
                                    handles=STREAM, mode="async", remote_check=NO_DEFAULT_KIND,
                                    default_kind=("", "src"), remote_async=True),
    "cudaMemcpyFromSymbolAsync": dict(remote=GEN, device=("symbol",), host_out={"dst": f"{D2H} ? count : 0"},
                                      handles=STREAM, mode="async", remote_check=NO_DEFAULT_KIND,
                                      default_kind=("dst", ""), remote_async=True),
    # hand-written on both sides (interpose/remote/special.c, proxy_server/src/special.c)
    "cudaLaunchKernel": dict(remote=HAND, remote_async=True),
    "__cudaLaunchKernel": dict(remote=HAND, remote_async=True),
    "cudaMallocHost": dict(remote=HAND, mode="sync"),
    "cudaHostAlloc": dict(remote=HAND, mode="sync"),
    "cudaFreeHost": dict(remote=HAND, mode="sync"),
    # host functions run by the worker when the stream reaches them (interpose/remote/hostfn.c)
    "cudaLaunchHostFunc": dict(remote=HAND),
    "cudaStreamAddCallback": dict(remote=HAND),
    # libraries of device code loaded at run time (interpose/remote/library.c, proxy_server/src/library.c)
    "cudaLibraryLoadData": dict(remote=HAND),
    "cudaLibraryLoadFromFile": dict(remote=HAND),
    "cudaLibraryEnumerateKernels": dict(remote=HAND),
    "cudaLibraryGetKernel": dict(remote=GEN, handles={"library": "module"}, creates={"pKernel": "kernel"},
                                 host_in={"name": "name ? strlen(name) + 1 : 0"}, mode="sync"),
    "cudaLibraryGetKernelCount": dict(remote=GEN, handles={"lib": "module"}, outputs=("count",), mode="sync"),
    "cudaLibraryUnload": dict(remote=GEN, handles={"library": "module"}, destroys=("library",), mode="sync"),
    # managed and registered host memory (interpose/remote/pinned.c)
    "cudaMallocManaged": dict(remote=HAND),
    "cudaHostRegister": dict(remote=HAND),
    "cudaHostUnregister": dict(remote=HAND),
    "cudaHostGetFlags": dict(remote=HAND),
    "cudaHostGetDevicePointer": dict(remote=HAND),
    # driver entry points: the driver fence's own stubs, which stop the job when called (interpose/remote/bypass.c)
    "cudaGetDriverEntryPoint": dict(remote=HAND, refused=""),
    "cudaGetDriverEntryPointByVersion": dict(remote=HAND, refused=""),
    # occupancy: a query about a kernel on the proxy's device
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor": dict(remote=GEN, outputs=("numBlocks",), device=("func",),
                                                          mode="sync"),
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags": dict(remote=GEN, outputs=("numBlocks",),
                                                                   device=("func",), mode="sync"),
    # refused when called, each with its reason (issue 19: what a CUDA PyTorch imports)
    **dict.fromkeys(("cudaIpcGetMemHandle", "cudaIpcOpenMemHandle", "cudaIpcCloseMemHandle", "cudaIpcGetEventHandle",
                     "cudaIpcOpenEventHandle"), dict(refused=IPC)),
    **dict.fromkeys(("cudaDeviceGetDefaultMemPool", "cudaMemPoolGetAttribute", "cudaMemPoolSetAttribute",
                     "cudaMemPoolSetAccess"), dict(refused=MEMPOOLS)),
    "cudaLaunchCooperativeKernel": dict(refused="cooperative launches (grid-wide synchronisation) are not marshalled: "
                                                "the proxy's launch path takes ordinary launches only"),
    **dict.fromkeys(("cudaGraphGetNodes", "cudaGraphNodeGetDependencies", "cudaGraphDebugDotPrint"),
                    dict(refused="graph introspection is not marshalled (stream capture, instantiation and launch "
                                 "are)")),
}
# NCCL: the communicator is a virtual handle; buffers are device pointers.
NCCL_BUFFERS = {"ncclAllReduce": ("sendbuff", "recvbuff"), "ncclBroadcast": ("sendbuff", "recvbuff"),
                "ncclBcast": ("buff",), "ncclReduce": ("sendbuff", "recvbuff"),
                "ncclAllGather": ("sendbuff", "recvbuff"), "ncclReduceScatter": ("sendbuff", "recvbuff"),
                "ncclAlltoAll": ("sendbuff", "recvbuff"), "ncclSend": ("sendbuff",), "ncclRecv": ("recvbuff",),
                "ncclGather": ("sendbuff", "recvbuff"), "ncclScatter": ("sendbuff", "recvbuff")}
# ncclConfig_t crosses as its bytes (config->size of them); its two pointers could not.
NCCL_CONFIG_PTRS = "config != NULL && (config->size == 0 || config->netName != NULL || config->commName != NULL)"
REMOTE_NCCL: dict[str, dict] = {
    **{name: dict(remote=GEN, device=buffers, remote_async=True) for name, buffers in NCCL_BUFFERS.items()},
    "ncclGetUniqueId": dict(remote=GEN, outputs=("uniqueId",), mode="sync"),
    "ncclCommInitRank": dict(remote=GEN, creates={"comm": "comm"}, mode="sync"),
    "ncclCommDestroy": dict(remote=GEN),
    "ncclCommAbort": dict(remote=GEN),
    "ncclCommGetAsyncError": dict(remote=GEN),
    "ncclCommCount": dict(remote=GEN, handles={"comm": "comm"}, outputs=("count",), mode="sync"),
    "ncclCommUserRank": dict(remote=GEN, handles={"comm": "comm"}, outputs=("rank",), mode="sync"),
    "ncclCommCuDevice": dict(remote=GEN, handles={"comm": "comm"}, outputs=("device",), mode="sync"),
    "ncclGroupStart": dict(remote=GEN, mode="sync", remote_async=True),
    "ncclGroupEnd": dict(remote=GEN, mode="sync", remote_async=True),
    "ncclGetVersion": dict(remote=GEN, outputs=("version",), mode="sync"),
    "ncclCommInitRankConfig": dict(remote=GEN, creates={"comm": "comm"}, mode="sync", remote_check=NCCL_CONFIG_PTRS,
                                   host_in={"config": "config ? config->size : 0"}),
    "ncclCommInitAll": dict(remote=HAND, mode="sync"),          # an array of communicators (nccl_init.c)
    "ncclGetLastError": dict(remote=HAND),                       # a string about a communicator (nccl_init.c)
    "ncclCommFinalize": dict(remote=GEN, handles={"comm": "comm"}, mode="sync"),
    "ncclMemAlloc": dict(remote=GEN, outputs=("ptr",), mode="sync"),     # in the proxy's range (alloc.c)
    "ncclMemFree": dict(remote=GEN, device=("ptr",), mode="sync"),
    "ncclRedOpCreatePreMulSum": dict(remote=GEN, outputs=("op",), handles={"comm": "comm"}, mode="sync",
                                     host_in={"scalar": "residence == ncclScalarHostImmediate ? "
                                                        "remote_nccl_type_size(datatype) : 0"}),
    "ncclRedOpDestroy": dict(remote=GEN, handles={"comm": "comm"}, mode="sync"),
    # refused when called, each with its reason (issue 19: what a CUDA PyTorch imports)
    "ncclCommSplit": dict(refused="communicator splits are not marshalled: a recovery rebuilds communicators from "
                                  "their unique ids, which a split one has none of (PyTorch splits for new_group when "
                                  "init_process_group got a device_id; leave device_id unset)"),
    "ncclCommShrink": dict(refused="shrinking a communicator is NCCL's own fault tolerance, which transparent "
                                   "recovery replaces"),
    "ncclCommInitRankScalable": dict(refused="initialisation from several unique ids is not marshalled "
                                             "(ncclCommInitRank and ncclCommInitRankConfig are)"),
    **dict.fromkeys(("ncclCommRegister", "ncclCommDeregister", "ncclCommWindowRegister", "ncclCommWindowDeregister"),
                    dict(refused="buffer and window registration is not marshalled (PyTorch registers buffers only "
                                 "when asked: TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK, symmetric memory)")),
    "ncclGroupSimulateEnd": dict(refused="simulating a group is not marshalled"),
}
# nvcc's hidden registration and launch-configuration entry points: no C header
# declares them, so they are hand-written on both sides.
HIDDEN_HAND = ("__cudaRegisterFatBinary", "__cudaRegisterFatBinaryEnd", "__cudaUnregisterFatBinary",
               "__cudaRegisterFunction", "__cudaRegisterVar", "__cudaInitModule", "__cudaGetKernel",
               "__cudaPushCallConfiguration", "__cudaPopCallConfiguration")
for _name, _cols in REMOTE.items():
    CUDART[_name] = replace(CUDART[_name], **_cols) if _name in CUDART else Fact(**_cols)

for _name, _cols in REMOTE_NCCL.items():
    NCCL[_name] = replace(NCCL[_name], **_cols) if _name in NCCL else Fact(**_cols)

# The NCCL versions that added functions of the table after 2.27 (``since``; NVIDIA/nccl's
# src/nccl.h.in at the release tags).  A build against an older nccl.h leaves them out.
NCCL_SINCE = {
    **dict.fromkeys(("ncclAlltoAll", "ncclGather", "ncclScatter"), "2.28"),
    **dict.fromkeys(("ncclAllReduceConfig", "ncclBroadcastConfig", "ncclReduceConfig", "ncclAllGatherConfig",
                     "ncclReduceScatterConfig", "ncclAlltoAllConfig", "ncclGatherConfig", "ncclScatterConfig"),
                    "2.31"),
}
for _name, _since in NCCL_SINCE.items():
    NCCL[_name] = replace(NCCL[_name], since=_since)

FACTS: dict[str, Fact] = {**CUDART, **NCCL}

# ---- cuBLAS (issue 19): forwarded at the library level when the build has cuBLAS's header -------------
# (gen_interpose.py --cublas-header; NVIDIA's nvidia-cublas wheel, cached by scripts/setup.sh).  Only
# transparent mode uses this table: the worker's cuBLAS calls go to the device proxy, whose libcublas runs
# them on the proxy's streams.  The handle is a virtual handle like a stream; the matrices and the workspace
# are device memory; the scalars alpha and beta are host memory copied with the call in host pointer mode and
# device addresses in device pointer mode.  interpose/remote/blas.c keeps each handle's device and settings:
# its pointer mode, its stream (for cublasGetStream_v2), and what a new proxy needs to re-create it after a
# restart or a recovery.  Every other function of cublas_api.h is refused by name.
_SCALAR_OF_COMPUTE = ("(computeType == CUBLAS_COMPUTE_64F || computeType == CUBLAS_COMPUTE_64F_PEDANTIC) ? 8 : "
                      "(computeType == CUBLAS_COMPUTE_16F || computeType == CUBLAS_COMPUTE_16F_PEDANTIC) ? 2 : 4")
_BLAS = {"handle": "blas"}


# A cuBLAS or cuDNN call that fails changes nothing on the device: the call log marks it, so that a replay (which
# would fail again and stop the recovery) skips it (PyTorch tries plans and catches the failures).
UNLOG_FAILED = "if (jr_ret != 0) calllog_unlog_last()"


def _gemm(scalar: str) -> Fact:
    return Fact(remote="gen", handles=_BLAS, device=("A", "B", "C"), mode="async", after=UNLOG_FAILED,
                host_in={name: f"remote_blas_scalar_bytes(handle, {name}, {scalar})" for name in ("alpha", "beta")})


CUBLAS: dict[str, Fact] = {
    "cublasCreate_v2": Fact(remote="gen", creates=_BLAS, mode="sync", after="if (jr_ret == 0) remote_blas_created(handle)"),
    "cublasDestroy_v2": Fact(remote="gen", handles=_BLAS, destroys=("handle",), mode="sync",
                             after="if (jr_ret == 0) remote_blas_destroyed(handle)"),
    "cublasGetVersion_v2": Fact(remote="gen", handles=_BLAS, outputs=("version",), mode="sync"),
    "cublasSetStream_v2": Fact(remote="gen", handles={**_BLAS, "streamId": "stream"}, mode="sync",
                               after="if (jr_ret == 0) remote_blas_set_stream(handle, streamId)"),
    "cublasGetStream_v2": Fact(remote="gen", handles=_BLAS, outputs=("streamId",), mode="sync",
                               answer_locally="remote_blas_get_stream(handle, streamId)"),
    "cublasSetMathMode": Fact(remote="gen", handles=_BLAS, mode="sync",
                              after="if (jr_ret == 0) remote_blas_set_math_mode(handle, mode)"),
    "cublasGetMathMode": Fact(remote="gen", handles=_BLAS, outputs=("mode",), mode="sync"),
    "cublasSetPointerMode_v2": Fact(remote="gen", handles=_BLAS, mode="sync",
                                    after="if (jr_ret == 0) remote_blas_set_pointer_mode(handle, mode)"),
    "cublasGetPointerMode_v2": Fact(remote="gen", handles=_BLAS, outputs=("mode",), mode="sync"),
    "cublasSetWorkspace_v2": Fact(remote="gen", handles=_BLAS, device=("workspace",), mode="sync",
                                  after="if (jr_ret == 0) remote_blas_set_workspace(handle, workspace, "
                                        "workspaceSizeInBytes)"),
    "cublasSgemm_v2": _gemm("sizeof(float)"),
    "cublasDgemm_v2": _gemm("sizeof(double)"),
    "cublasSgemmStridedBatched": _gemm("sizeof(float)"),
    "cublasDgemmStridedBatched": _gemm("sizeof(double)"),
    "cublasGemmEx": _gemm(_SCALAR_OF_COMPUTE),
    "cublasGemmStridedBatchedEx": _gemm(_SCALAR_OF_COMPUTE),
}

# ---- cuBLASLt (issue 19): forwarded when the build also has cublasLt.h (gen_interpose.py --cublaslt-header).
# Written by hand (interpose/remote/blaslt.c, proxy_server/src/blaslt.c), not generated: a descriptor
# (matmul, matrix layout, preference) is a host-only object, so the worker keeps it itself and each
# cublasLtMatmul or heuristic query carries the descriptors it uses; nothing about a descriptor lives in the
# proxy, so a restart or a replay has none to re-create.  A cuBLASLt handle is a cuBLAS handle (cuBLAS
# documents that any cublasHandle_t serves as a cublasLtHandle_t, and PyTorch passes its cuBLAS handle):
# cublasLtCreate makes one through cublasCreate_v2, re-created after a restart as every cuBLAS handle is.
# Every other function of cublasLt.h is refused by name.  These names get remote function ids; those that
# never leave the worker (the descriptors' create, set and destroy) simply never use theirs.
# Written by hand and answered in the worker itself, never sent to the proxy: the driver entry points (the
# fence's stubs, interpose/remote/bypass.c) and cuBLASLt's descriptors (interpose/remote/blaslt.c).
ANSWERED_IN_WORKER = ("cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion",
                      "cudaGetDriverEntryPoint_ptsz", "cudaGetDriverEntryPointByVersion_ptsz",
                      "cublasLtCreate", "cublasLtDestroy", "cublasLtGetStatusName", "cublasLtGetStatusString",
                      "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy", "cublasLtMatmulDescSetAttribute",
                      "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy", "cublasLtMatrixLayoutSetAttribute",
                      "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy",
                      "cublasLtMatmulPreferenceSetAttribute")
CUBLASLT_HAND = ("cublasLtCreate", "cublasLtDestroy", "cublasLtGetStatusName", "cublasLtGetStatusString",
                 "cublasLtMatmul", "cublasLtMatmulAlgoGetHeuristic",
                 "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy", "cublasLtMatmulDescSetAttribute",
                 "cublasLtMatmulDescGetAttribute",
                 "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy", "cublasLtMatrixLayoutSetAttribute",
                 "cublasLtMatrixLayoutGetAttribute",
                 "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy",
                 "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulPreferenceGetAttribute")

# ---- cuDNN (issue 19): forwarded when the build has cuDNN's headers (gen_interpose.py --cudnn-include; the
# nvidia-cudnn-cu13 wheel's, cached by scripts/setup.sh).  A cuDNN handle is a virtual handle like a cuBLAS
# one (re-created after a restart with its stream, interpose/remote/dnn.c).  Two kinds of descriptor:
#   - the backend (graph) API's, through which PyTorch runs convolutions and attention: virtual handles too
#     (their setup can be costly: a finalized execution plan), created and finalized in the proxy; the worker
#     keeps every call that defined one, in order, and plays them to a new proxy after a restart
#     (hand-written: DNN_HAND).  A variant pack (device pointers for one execution) is kept in the worker
#     and carried by the cudnnBackendExecute that uses it, as cuBLASLt's descriptors are;
#   - the legacy API's tensor descriptors, which PyTorch's BatchNorm creates around every call: kept in the
#     worker; a call that uses one carries its contents (handles kind "dnn_tensor"), the proxy makes a
#     temporary descriptor for the call.
# An activation descriptor (BatchNorm's fused activation) must be NULL, as PyTorch passes it (kind
# "null_only"): a call with one is refused by name.  Every other function of the headers is refused by name.
_DNN = {"handle": "dnn"}
# BatchNorm's running statistics are updated in place during the forward pass: a replay of the minibatch would
# apply the update twice (interpose/remote/dnn.c announces them to interpose/remote/rewind.c, whole).
_RUNNING_STATS = ("if (jr_ret == 0) remote_dnn_running_stats(bnScaleBiasMeanVarDesc, resultRunningMean, "
                  "resultRunningVariance, exponentialAverageFactor)")


def _bn(scalars: tuple[str, ...] = (), of: str = "xDesc", mode: str = "async", after: str = "") -> Fact:
    """A BatchNorm call of the legacy API.  The host scalars are as large as the tensors' compute type (double
    for double tensors, else float).  The rest comes from the prototype (gen_interpose.describe_cudnn): each
    cudnnTensorDescriptor_t is carried by value, a cudnnActivationDescriptor_t must be NULL, every other
    pointer to void is device memory and a size_t * is an output; a call with an activation
    descriptor is refused."""
    return Fact(remote="gen", handles=_DNN, mode=mode, after=f"{UNLOG_FAILED};\n    {after}" if after else UNLOG_FAILED,
                host_in={s: f"remote_dnn_scalar_bytes({of}, {s})" for s in scalars})


CUDNN: dict[str, Fact] = {
    "cudnnCreate": Fact(remote="gen", creates=_DNN, mode="sync", after="if (jr_ret == 0) remote_dnn_created(handle)"),
    "cudnnDestroy": Fact(remote="gen", handles=_DNN, destroys=("handle",), mode="sync",
                         after="if (jr_ret == 0) remote_dnn_destroyed(handle)"),
    "cudnnSetStream": Fact(remote="gen", handles={**_DNN, "streamId": "stream"}, mode="sync",
                           after="if (jr_ret == 0) remote_dnn_set_stream(handle, streamId)"),
    "cudnnGetStream": Fact(remote="gen", handles=_DNN, outputs=("streamId",), mode="sync",
                           answer_locally="remote_dnn_get_stream(handle, streamId)"),
    "cudnnBatchNormalizationForwardTraining": _bn(("alpha", "beta"), after=_RUNNING_STATS),
    "cudnnBatchNormalizationForwardTrainingEx": _bn(("alpha", "beta"), after=_RUNNING_STATS),
    "cudnnBatchNormalizationForwardInference": _bn(("alpha", "beta")),
    "cudnnBatchNormalizationBackward": _bn(("alphaDataDiff", "betaDataDiff", "alphaParamDiff", "betaParamDiff")),
    "cudnnBatchNormalizationBackwardEx": _bn(("alphaDataDiff", "betaDataDiff", "alphaParamDiff", "betaParamDiff")),
    "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize": _bn(mode="sync"),
    "cudnnGetBatchNormalizationBackwardExWorkspaceSize": _bn(mode="sync"),
    "cudnnGetBatchNormalizationTrainingExReserveSpaceSize": _bn(mode="sync"),
}
# Written by hand (interpose/remote/dnn.c, proxy_server/src/dnn.c): the backend API, and the legacy tensor
# descriptors (answered in the worker).
DNN_BACKEND = ("cudnnBackendCreateDescriptor", "cudnnBackendDestroyDescriptor", "cudnnBackendSetAttribute",
               "cudnnBackendGetAttribute", "cudnnBackendFinalize", "cudnnBackendExecute", "cudnnBackendInitialize")
DNN_TENSOR = ("cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor", "cudnnSetTensorNdDescriptor",
              "cudnnSetTensor4dDescriptor", "cudnnSetTensor4dDescriptorEx", "cudnnGetTensorNdDescriptor",
              "cudnnGetTensor4dDescriptor", "cudnnSetTensorNdDescriptorEx", "cudnnDeriveBNTensorDescriptor")
# cudnnGetProperty: the worker's own libcudnn answers (a pure query with an output pointer, which the generator
# would refuse); cudnnGetLastErrorString: the proxy's cuDNN, which made the calls, answers.
DNN_HAND = (*DNN_BACKEND, *DNN_TENSOR, "cudnnGetProperty", "cudnnGetLastErrorString")
ANSWERED_IN_WORKER = (*ANSWERED_IN_WORKER, *DNN_TENSOR, "cudnnBackendInitialize", "cudnnGetProperty")
