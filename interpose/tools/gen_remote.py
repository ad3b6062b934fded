"""The remote (transparent-mode) half of the generator: worker stubs and proxy dispatch.

Called by ``gen_interpose.py --remote``.  From the same API description as the
passthrough library (NVIDIA's prototypes plus ``api_facts.py``) it writes:

  remote_fns.h        enum remote_fn: one id per marshalled function (the wire's function ids)
  remote_stubs.c      libjitckpt_remote.so's exported CUDA runtime and NCCL entry points
                      (and remote_fn_async, the calls posted without waiting):
                      a generated stub per ``remote="gen"`` function (marshal, call, unmarshal),
                      the per-thread default stream twin (``_ptsz``/``_ptds``) of every
                      marshalled function (its stream 0 becomes cudaStreamPerThread),
                      a refusal per function remote mode cannot marshal yet, and an
                      in-process call of the real library per pure function
  remote.map          its linker version script
  proxy_dispatch.c    the proxy's half: per ``remote="gen"`` function, unmarshal, call the real
                      function, marshal the results; the dispatch table; the symbol lookup

How a parameter crosses (module docstring of api_facts.py): by value when its type is not a
pointer; a virtual id when ``handles`` names it; back as a virtual id when ``creates`` does;
back as ``sizeof *p`` bytes when ``outputs`` does; its value unchanged when ``device`` does;
its bytes through the arena when ``host_in``/``host_out`` give a size (value unchanged when
the size is 0); back as a string when ``out_strings`` does.  A ``remote="gen"`` function
with any other pointer or handle parameter stops the generator with the parameter's name.
"""

from __future__ import annotations

import re

# Opaque handle typedefs (pointers in disguise): one of them crossing by value would hand
# the proxy a worker-side value, so each must be classified.
HANDLE_TYPES = {
    "cudaStream_t": "stream", "cudaEvent_t": "event", "cudaKernel_t": "kernel", "cudaFunction_t": "func",
    "cudaGraph_t": "graph", "cudaGraphExec_t": "graph_exec", "cudaGraphNode_t": "graph", "cudaLibrary_t": "module",
    "cudaArray_t": "", "cudaArray_const_t": "", "cudaMipmappedArray_t": "", "cudaMemPool_t": "",
    "cudaUserObject_t": "", "cudaGraphicsResource_t": "", "cudaExternalMemory_t": "",
    "cudaExternalSemaphore_t": "", "cudaAsyncCallbackHandle_t": "", "cudaLogsCallbackHandle": "",
    "ncclComm_t": "comm", "cudaGraphDeviceNode_t": "", "cudaMemFabricHandle_t": "",
    "cublasHandle_t": "blas", "cudnnHandle_t": "dnn", "cudnnTensorDescriptor_t": "dnn_tensor",
    "cudnnActivationDescriptor_t": "",
}
KIND_ENUM = {"stream": "VH_STREAM", "event": "VH_EVENT", "kernel": "VH_KERNEL", "module": "VH_MODULE",
             "comm": "VH_COMM", "graph": "VH_GRAPH", "graph_exec": "VH_GRAPH_EXEC", "func": "VH_FUNC",
             "blas": "VH_BLAS", "dnn": "VH_DNN"}
# Handle kinds that are no virtual handle: a cuDNN tensor descriptor, kept in the worker and carried by value
# (interpose/remote/dnn.c: remote_dnn_put_tensor; the proxy makes a temporary one, proxy_server/src/dnn.c), and
# a descriptor the call must be given as NULL (its remote_check refuses any other).
BY_VALUE = {"dnn_tensor", "null_only"}
# Functions whose stub tells remote/restart.c (track.h) what it created or destroyed, after a
# successful call: the state a restarted proxy is given back (milestone 2b).
TRACKED = {"cudaSetDevice", "cudaMalloc", "cudaFree", "cudaStreamCreate", "cudaStreamCreateWithFlags",
           "cudaStreamCreateWithPriority", "cudaStreamDestroy", "cudaEventCreate", "cudaEventCreateWithFlags",
           "cudaEventDestroy", "ncclCommInitRank", "ncclCommDestroy", "ncclCommAbort", "cudaMallocPitch",
           "cudaMallocAsync", "cudaFreeAsync", "cudaDeviceReset", "ncclMemAlloc", "ncclMemFree",
           "ncclCommInitRankConfig", "cudaGetFuncBySymbol", "cudaLibraryUnload",
           "cudaLibraryGetKernel", "cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
           "cudaGraphInstantiateWithFlags", "cudaGraphExecDestroy", "cudaGraphDestroy"}
# Settings of the device or of a kernel that outlive the call: the stub hands the request
# it sent to remote_track_setting (restart.c), which sends it again to a restarted proxy.
SETTINGS = {"cudaSetDeviceFlags", "cudaDeviceSetLimit", "cudaDeviceSetCacheConfig", "cudaFuncSetAttribute",
            "cudaFuncSetCacheConfig", "cudaDeviceEnablePeerAccess", "cudaDeviceDisablePeerAccess", "cudaInitDevice"}
# The per-thread default stream twins (cudaMemcpy_ptds) of functions without a stream
# parameter: the stream-ordered function on cudaStreamPerThread, then (when the plain one
# waits) a synchronisation of that stream.
PTDS_VIA_ASYNC = {"cudaMemcpy": ("cudaMemcpyAsync", True), "cudaMemcpy2D": ("cudaMemcpy2DAsync", True),
                  "cudaMemcpyToSymbol": ("cudaMemcpyToSymbolAsync", True),
                  "cudaMemcpyFromSymbol": ("cudaMemcpyFromSymbolAsync", True),
                  "cudaMemset": ("cudaMemsetAsync", False), "cudaMemset2D": ("cudaMemset2DAsync", False),
                  "cudaMemcpyPeer": ("cudaMemcpyPeerAsync", True)}
ERROR_TYPES = {"cudaError_t": "cudaErrorNotSupported", "ncclResult_t": "ncclInvalidUsage",
               "cublasStatus_t": "CUBLAS_STATUS_NOT_SUPPORTED", "cudnnStatus_t": "CUDNN_STATUS_NOT_SUPPORTED"}
# What a call returns when there is no proxy to call (remote_begin failed).
UNAVAILABLE = {"ncclResult_t": "ncclSystemError", "cublasStatus_t": "CUBLAS_STATUS_NOT_INITIALIZED",
               "cudnnStatus_t": "CUDNN_STATUS_NOT_INITIALIZED"}
# Where the real library's pure functions are looked up (remote_local_fn in refuse.c).
NEXT_LIBRARY = {"cudart": "remote_next_cudart", "nccl": "remote_next_nccl", "cublas": "remote_next_cublas",
                "cublasLt": "remote_next_cublaslt", "cudnn": "remote_next_cudnn"}
HIDDEN_PROTOS = {
    "__cudaRegisterFatBinary": "void **__cudaRegisterFatBinary(void *fatCubin)",
    "__cudaRegisterFatBinaryEnd": "void __cudaRegisterFatBinaryEnd(void **fatCubinHandle)",
    "__cudaUnregisterFatBinary": "void __cudaUnregisterFatBinary(void **fatCubinHandle)",
}


class RemoteGenError(Exception):
    pass


def c_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def pointee(type_: str) -> str:
    return type_[:-1].rstrip() if type_.endswith("*") else ""


def classify(function) -> list[tuple[str, object]]:
    """(class, detail) per parameter of a remote="gen" function, in order."""
    fact, out = function.fact, []
    for p in function.proto.params:
        base = p.type.replace("const ", "").strip()
        if p.name in fact.handles:
            out.append(("handle", fact.handles[p.name]))
        elif p.name in fact.creates:
            out.append(("create", fact.creates[p.name]))
        elif p.name in fact.outputs:
            out.append(("output", None))
        elif p.name in fact.out_strings:
            out.append(("out_string", None))
        elif p.name in fact.host_in:
            out.append(("host_in", fact.host_in[p.name]))
        elif p.name in fact.host_out:
            out.append(("host_out", fact.host_out[p.name]))
        elif p.name in fact.host_inout:
            out.append(("host_inout", fact.host_inout[p.name]))
        elif p.name in fact.device:
            out.append(("device", None))
        elif p.type.endswith("*") or base in HANDLE_TYPES:
            raise RemoteGenError(f"{function.name}: remote=\"gen\" but parameter {p.decl()} is neither "
                                 f"a handle, an output, a device pointer nor a host buffer in api_facts.py")
        else:
            out.append(("value", None))
    return out


def check_async(functions: dict) -> None:
    """A call posted to the request ring (``remote_async``) returns before the proxy ran it: it
    must have nothing to answer, and nothing the worker records only after a success."""
    for name, f in functions.items():
        if not f.fact.remote_async:
            continue
        if f.fact.outputs or f.fact.creates or f.fact.out_strings:
            raise RemoteGenError(f"{name}: remote_async, but the call answers (outputs, creates or out_strings)")
        if f.fact.remote not in ("gen", "hand"):
            raise RemoteGenError(f"{name}: remote_async needs remote=\"gen\" or \"hand\"")
        if name in TRACKED:
            raise RemoteGenError(f"{name}: remote_async, but a proxy restart tracks its success (TRACKED)")


def ok_expr(proto) -> str:
    """The results under which a call's outputs are valid: NCCL's non-blocking calls
    (ncclCommInitRankConfig with blocking = 0) hand out their objects with ncclInProgress."""
    return "(jr_ret == ncclSuccess || jr_ret == ncclInProgress)" if proto.ret == "ncclResult_t" else "jr_ret == 0"


def worker_stub(function, rfn: str) -> str:
    proto, fact = function.proto, function.fact
    ok = ok_expr(proto)
    classes = classify(function)
    lines = [f"EXPORT {proto.decl()}", "{"]
    if fact.default_kind:
        # cudaMemcpyDefault: the worker knows its device allocations and shared regions (restart.c)
        dst, src = (f"(const void *){n}" if n else "NULL" for n in fact.default_kind)
        lines += ["    if (kind == cudaMemcpyDefault)",
                  f"        kind = remote_default_kind({dst}, {src});"]
    if fact.answer_locally:
        lines += [f"    int jr_here = {fact.answer_locally};", "    if (jr_here != -1)",
                  f"        return ({proto.ret})jr_here;"]
    if fact.local_h2h:
        lines += ["    if (kind == cudaMemcpyHostToHost)",
                  f"        return remote_copy_h2h(dst, src, count, {fact.local_h2h});"]
    if fact.remote_check:
        refuse = f"remote_refuse_call({c_str(function.name)}, {c_str(fact.remote_check)})"
        if proto.ret != "cudaError_t":
            lines += [f"    if ({fact.remote_check}) {{", f"        {refuse};", f"        return {ERROR_TYPES[proto.ret]};",
                      "    }"]
        else:
            lines += [f"    if ({fact.remote_check})", f"        return {refuse};"]
    for p, (cls, detail) in zip(proto.params, classes):
        if cls == "handle" and detail == "stream":      # cudaStreamPerThread: this thread's own (remote/ptds.c)
            lines.append(f"    {p.name} = remote_stream({p.name});")
    unavailable = UNAVAILABLE.get(proto.ret, "remote_unavailable()")
    lines += ["    struct rcall jr_c;", f"    if (remote_begin(&jr_c, {rfn}) != 0)", f"        return {unavailable};"]
    for p, (cls, detail) in zip(proto.params, classes):
        if cls in ("value", "device", "host_in", "host_out", "host_inout"):
            lines.append(f"    rc_put(&jr_c, &{p.name}, sizeof {p.name});")
        elif cls == "handle" and detail == "dnn_tensor":
            lines.append(f"    remote_dnn_put_tensor(&jr_c, {p.name});")
        elif cls == "handle" and detail == "null_only":
            continue
        elif cls == "handle":
            lines.append(f"    rc_put_handle(&jr_c, (const void *){p.name});")
        elif cls in ("output", "create", "out_string"):
            lines.append(f"    rc_put_flag(&jr_c, {p.name} != NULL);")
    for p, (cls, detail) in zip(proto.params, classes):
        if cls == "host_in":
            # (the pointer crossed above: a buffer in shared pinned memory crosses as itself, marshal.c)
            lines.append(f"    rc_put_host_in(&jr_c, {p.name}, (size_t)({detail}));")
        elif cls == "host_out":
            lines.append(f"    void *out_{p.name} = rc_put_host_out(&jr_c, {p.name}, (size_t)({detail}));")
        elif cls == "host_inout":
            lines.append(f"    void *out_{p.name} = rc_put_host_inout(&jr_c, {p.name}, (size_t)({detail}));")
    lines.append(f"    {proto.ret} jr_ret = ({proto.ret})remote_call(&jr_c);")
    # Outputs come back only from a call that succeeded (as the runtime leaves them alone otherwise).
    for p, (cls, detail) in zip(proto.params, classes):
        if cls in ("host_out", "host_inout"):
            lines.append(f"    rc_get_out(&jr_c, {p.name}, out_{p.name}, (size_t)({detail}));")
        elif cls == "output":
            lines.append(f"    if ({ok} && {p.name} != NULL)\n        rc_get(&jr_c, {p.name}, sizeof *{p.name});")
        elif cls == "create":
            lines.append(f"    if ({ok} && {p.name} != NULL)\n        rc_get_handle(&jr_c, (void **){p.name});")
        elif cls == "out_string":
            lines.append(f"    if ({ok} && {p.name} != NULL)\n        *{p.name} = rc_get_string(&jr_c);")
    if fact.after:
        lines.append(f"    {fact.after};")
    if function.name in TRACKED:       # what a proxy restart re-creates (remote/restart.c)
        lines.append(f"    if ({ok})\n        remote_track_{function.name}("
                     + ", ".join(p.name for p in proto.params) + ");")
    if function.name in SETTINGS:      # given back to a restarted proxy (remote/restart.c)
        lines.append("    if (jr_ret == 0)\n        remote_track_setting(&jr_c);")
    lines += ["    remote_end(&jr_c);", "    return jr_ret;", "}", ""]
    return "\n".join(lines)


def proxy_dispatch_fn(function) -> str:
    proto, fact = function.proto, function.fact
    ok = ok_expr(proto)
    classes = classify(function)
    bad_handle = {"ncclResult_t": "ncclInvalidArgument", "cublasStatus_t": "CUBLAS_STATUS_NOT_INITIALIZED",
                  "cudnnStatus_t": "CUDNN_STATUS_BAD_PARAM"}.get(proto.ret, "cudaErrorInvalidResourceHandle")
    bad = "ncclInvalidArgument" if proto.ret == "ncclResult_t" else "RD_BAD"
    lines = [f"static int32_t d_{function.name}(struct rdisp *jr_d)", "{",
             f"    if (real_{function.name} == NULL)      /* not in the library loaded (dispatch_resolve) */",
             f"        return dispatch_missing({c_str(function.name)});"]
    for p, (cls, detail) in zip(proto.params, classes):
        if cls in ("output", "create"):
            lines.append(f"    {pointee(p.type)} v_{p.name};")
            lines.append(f"    memset(&v_{p.name}, 0, sizeof v_{p.name});")
            lines.append(f"    {p.type} {p.name} = NULL;")
        elif cls == "out_string":
            lines.append(f"    const char *v_{p.name} = NULL, **{p.name} = NULL;")
        else:
            # "const ncclComm_t comm" is assigned here: drop a top-level const.
            type_ = p.type[len("const "):] if p.type.startswith("const ") and not p.type.endswith("*") else p.type
            lines.append(f"    {type_} {p.name};")
            lines.append(f"    memset(&{p.name}, 0, sizeof {p.name});")
        if cls == "handle" and detail not in BY_VALUE:
            lines.append(f"    uint64_t vid_{p.name} = 0;")
    tensors = [p.name for p, (cls, detail) in zip(proto.params, classes) if cls == "handle" and detail == "dnn_tensor"]
    for p, (cls, detail) in zip(proto.params, classes):
        if cls in ("value", "device", "host_in", "host_out", "host_inout"):
            lines.append(f"    if (rd_get(jr_d, &{p.name}, sizeof {p.name}))\n        return {bad};")
        elif cls == "handle" and detail == "dnn_tensor":
            # (a temporary descriptor, gone when the dispatch ends: rd_dnn_tensors_release below)
            lines.append(f"    if (rd_dnn_tensor(jr_d, &{p.name}))\n        return {bad_handle};")
        elif cls == "handle" and detail == "null_only":
            continue
        elif cls == "handle":
            lines.append(f"    if (rd_get_handle(jr_d, {KIND_ENUM[detail]}, &vid_{p.name}, (void **)&{p.name}))\n"
                         f"        return {bad_handle};")
        elif cls in ("output", "create", "out_string"):
            lines.append(f"    if (rd_flag(jr_d))\n        {p.name} = &v_{p.name};")
    for p, (cls, _) in zip(proto.params, classes):
        if cls == "device" and p.name == "func":     # a host stub, or a kernel handle (virtual here)
            lines.append(f"    {p.name} = rd_func({p.name});")
    for p, (cls, _) in zip(proto.params, classes):
        if cls in ("host_in", "host_out", "host_inout"):
            which = "host_out" if cls == "host_inout" else cls       # the arena holds the bytes either way
            lines.append(f"    if (rd_{which}(jr_d, (const void **)&{p.name}))\n        return {bad};")
    args = ", ".join(p.name for p in proto.params)
    lines.append(f"    {proto.ret} jr_ret = real_{function.name}({args});")
    if tensors:
        lines.append("    rd_dnn_tensors_release();")
    stream = next((p.name for p, (cls, d) in zip(proto.params, classes) if cls == "handle" and d == "stream"), None)
    if fact.mode == "async" and stream and any(cls in ("host_out", "host_inout") for cls, _ in classes):
        lines.append("    /* a destination in the arena (or pinned, when the worker asks): complete when the call returns */")
        lines.append(f"    if (jr_ret == cudaSuccess && rd_has_out(jr_d))\n"
                     f"        jr_ret = real_cudaStreamSynchronize({stream});")
    for p, (cls, detail) in zip(proto.params, classes):
        if cls == "output":
            lines.append(f"    if ({ok} && {p.name} != NULL)\n        rd_put(jr_d, {p.name}, sizeof *{p.name});")
        elif cls == "create":
            lines.append(f"    if ({ok} && {p.name} != NULL)\n        rd_put_new_handle(jr_d, {KIND_ENUM[detail]}, "
                         f"(void *)*{p.name});")
        elif cls == "out_string":
            lines.append(f"    if ({ok} && {p.name} != NULL)\n        rd_put_string(jr_d, *{p.name});")
    for name in fact.destroys:
        kind = fact.handles.get(name)
        if kind:
            lines.append(f"    if (jr_ret == 0)\n        vh_forget({KIND_ENUM[kind]}, vid_{name});")
    lines += ["    return (int32_t)jr_ret;", "}", ""]
    return "\n".join(lines)


def refusal(name: str, proto, reason: str) -> str:
    if proto is None:
        # No usable prototype: the caller's arguments are ignored and the int result
        # (cudaError_t or ncclResult_t in every such function the ABI has) is the error.
        err = ("ncclInvalidUsage" if name.startswith(("nccl", "pnccl")) else
               "CUBLAS_STATUS_NOT_SUPPORTED" if name.startswith("cublas") else
               "CUDNN_STATUS_NOT_SUPPORTED" if name.startswith("cudnn") else "cudaErrorNotSupported")
        return (f"EXPORT int {name}(void)\n{{\n    remote_refuse({c_str(name)}, {c_str(reason)});\n"
                f"    return {err};\n}}\n")
    return (f"EXPORT {proto.decl()}\n{{\n    remote_refuse({c_str(name)}, {c_str(reason)});\n"
            f"    return {ERROR_TYPES[proto.ret]};\n}}\n")


def local_call(name: str, proto, library: str) -> str:
    args = ", ".join(p.name for p in proto.params)
    lookup = NEXT_LIBRARY[library]
    # Inside the call the real library finds no CUDA driver (remote/bypass.c): a pure function answers
    # without one, and the worker never reaches the real driver.
    call = (f"    remote_pure_call(1);\n    next({args});\n    remote_pure_call(0);\n" if proto.ret == "void" else
            f"    remote_pure_call(1);\n    {proto.ret} pure_result = next({args});\n    remote_pure_call(0);\n"
            f"    return pure_result;\n")
    return (f"EXPORT {proto.decl()}\n{{\n    static void *fn;\n"
            f"    __typeof__({name}) *next = (__typeof__({name}) *)remote_local_fn(&fn, {c_str(name)}, {lookup});\n"
            + call + "}\n")


def twin_stub(function, functions: dict) -> str:
    """The per-thread default stream twin of a marshalled function: stream 0 is cudaStreamPerThread."""
    proto = function.proto
    decl = proto.renamed(function.twin).decl()
    marker = f"/* per-thread twin of {function.name} */"
    if function.name in PTDS_VIA_ASYNC:
        other, wait = PTDS_VIA_ASYNC[function.name]
        oparams = functions[other].proto.params
        args = ", ".join("cudaStreamPerThread" if p.type == "cudaStream_t" else p.name for p in oparams)
        body = [f"    cudaError_t jr_ret = {other}({args});"]
        if wait:
            body += ["    if (jr_ret == cudaSuccess)", "        jr_ret = cudaStreamSynchronize(cudaStreamPerThread);"]
        body.append("    return jr_ret;")
        return "\n".join([marker, f"EXPORT {decl}", "{", *body, "}", ""])
    stream = next(p.name for p in proto.params if p.type == "cudaStream_t")
    args = ", ".join(p.name for p in proto.params)
    return "\n".join([marker, f"EXPORT {decl}", "{", f"    if ({stream} == NULL)",
                      f"        {stream} = cudaStreamPerThread;", f"    return {function.name}({args});", "}", ""])


def has_twin_stub(function) -> bool:
    """A marshalled function whose per-thread twin the generator writes (twin_stub)."""
    return bool(function.twin) and function.fact.remote in ("gen", "hand") and (
        function.name in PTDS_VIA_ASYNC or any(p.type == "cudaStream_t" for p in function.proto.params)) and (
        function.name not in HAND_TWINS)


# Functions no header declares that remote mode refuses by design, and why.
REFUSED_HIDDEN = {"__cudaRegisterManagedVar": "__managed__ variables: the runtime places their storage in the "
                                              "device proxy's memory, which the program cannot map",
                  # declared by nccl_device/host.h, not nccl.h: NCCL's device API (kernels that use symmetric
                  # memory directly), which PyTorch imports
                  **dict.fromkeys(("ncclDevCommCreate", "ncclDevCommDestroy"),
                                  "NCCL's device API (device-initiated communication over symmetric memory) is not "
                                  "marshalled")}

# Hand-written twins: the stream sits inside a structure (interpose/remote/special.c), or there is none
# (the driver entry points: interpose/remote/bypass.c).
HAND_TWINS = {"cudaLaunchKernelExC", "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion"}


def generate(functions: dict, cuda: dict, nccl: dict, twins: dict, all_names: set[str], newer: dict[str, str],
             hand: tuple[str, ...], banner: str, soname: str, blas: dict | None = None,
             dnn: dict | None = None) -> dict[str, str]:
    """The remote files, by name.

    ``blas``: every prototype of cuBLAS's header when the build forwards cuBLAS
    (its marshalled functions are in ``functions``, library "cublas"): the
    others are exported as refusals, all under the version node
    ``libcublas.so.13``, so that no cuBLAS call reaches a real cuBLAS in the
    worker.

    ``newer`` maps the facts table's NCCL functions that the header is too old
    to declare to the reason a call of one is refused (with its ``pnccl``
    twin): exported as refusals, so that a program built against a newer NCCL
    never reaches a real NCCL in the worker with a virtual communicator.
    """
    gen = {n: f for n, f in functions.items() if f.fact.remote == "gen"}
    hand_names = [*hand, *(n for n, f in functions.items() if f.fact.remote == "hand")]
    hand_names += [functions[n].twin for n in HAND_TWINS if n in functions and functions[n].twin]
    for name, f in gen.items():
        if f.fact.refused:
            raise RemoteGenError(f"{name}: both refused and remote=\"gen\"")
        if f.proto.ret not in ERROR_TYPES:
            raise RemoteGenError(f"{name}: remote=\"gen\" needs a cudaError_t/ncclResult_t result")
        classify(f)
    check_async(functions)
    ids = sorted(gen) + sorted(set(hand_names))
    fns = [banner, "#ifndef JITCKPT_REMOTE_FNS_H", "#define JITCKPT_REMOTE_FNS_H", "", "enum remote_fn {",
           "    RFN_none = 0,"] + [f"    RFN_{n}," for n in ids] + ["    RFN_count", "};", "", "#endif", ""]

    stubs = [banner, '#include "remote.h"', '#include "track.h"', "",
             "/* Posted to the request ring without waiting (api_facts.py: remote_async). */",
             "const unsigned char remote_fn_async[RFN_count] = {"]
    stubs += [f"    [RFN_{n}] = 1," for n in ids if n in functions and functions[n].fact.remote_async]
    stubs += ["};", ""]
    exported: list[tuple[str, str]] = []          # (name, library)
    for name, f in sorted(gen.items()):
        stubs.append(worker_stub(f, f"RFN_{name}"))
        exported.append((name, f.library))
    done = set(gen) | set(hand_names)
    for name, f in sorted(functions.items()):
        if has_twin_stub(f):
            stubs.append(twin_stub(f, functions))
            exported.append((f.twin, f.library))
            done.add(f.twin)
    skipped: list[str] = []
    blas = blas or {}
    dnn = dnn or {}
    for name in sorted(set(cuda) | set(nccl) | set(blas) | set(dnn)):
        if name in done:
            continue
        proto = cuda.get(name) or nccl.get(name) or blas.get(name) or dnn.get(name)
        library = ("nccl" if name in nccl else "cublasLt" if name.startswith("cublasLt") else
                   "cublas" if name in blas else "cudnn" if name in dnn else "cudart")
        fact = functions.get(name) or (functions.get(name[1:]) if name.startswith("pnccl") else None)
        if proto.ret in ERROR_TYPES:
            reason = fact.fact.refused if fact and fact.fact.refused else "not marshalled by remote mode yet"
            # cuBLAS's half-precision prototypes are declared for C++ only: refused without a prototype in C.
            cxx_only = any(t in p.type for p in proto.params for t in ("__half", "__nv_bfloat16"))
            stubs.append(refusal(name, None if cxx_only else proto, reason))
        elif proto.ret == "const char *" and any(p.type in HANDLE_TYPES for p in proto.params):
            # A string about a handle (ncclGetLastError(comm)): the handle is virtual here.
            stubs.append(f"EXPORT {proto.decl()}\n{{\n    remote_refuse({c_str(name)}, \"not marshalled by remote "
                         f"mode yet\");\n    return \"(not available in transparent mode)\";\n}}\n")
        elif proto.ret == "void" or any(p.type.endswith("*") and "char" not in p.type or p.type in HANDLE_TYPES
                                        for p in proto.params):
            # Pointer parameters would be worker-side values; void ones (NCCL's debug
            # reset, a macro too) have no result to be pure about.  Not exported: they bind
            # to the real library, where none of them touches device state.
            skipped.append(name)
            done.add(name)
            continue
        else:
            stubs.append(local_call(name, proto, library))
        exported.append((name, library))
        done.add(name)
    # Everything else the API has: per-thread twins, prototypes the parser skips (function
    # pointers), nvcc's hidden entry points refused by design, the NCCL functions newer than the header.
    newer = {**newer, **{"p" + name: reason for name, reason in newer.items()}}
    others = set(twins.values()) | set(all_names) | set(REFUSED_HIDDEN) | set(newer)
    for name in sorted(others - done):
        if not name.startswith(("cuda", "__cuda", "nccl", "pnccl")) or name in hand_names:
            continue
        plain = re.sub(r"_pt(sz|ds)$", "", name)
        if name in REFUSED_HIDDEN:
            reason = REFUSED_HIDDEN[name]
        elif name in newer:
            reason = newer[name]
        elif plain in functions and functions[plain].fact.refused:
            reason = functions[plain].fact.refused       # a twin of a function refused by design (graphs)
        else:
            reason = ("the per-thread default stream is not marshalled by remote mode yet"
                      if name.endswith(("_ptsz", "_ptds")) else "not marshalled by remote mode yet")
        stubs.append(refusal(name, None, reason))
        exported.append((name, "nccl" if name.startswith(("nccl", "pnccl")) else "cudart"))
        done.add(name)
    stubs.append("/* Not exported (they bind to the real library; none touches device state): "
                 + ", ".join(skipped) + " */\n")
    cuda_exports = sorted({n for n, lib in exported if lib == "cudart"} |
                          {n for n in hand_names if not n.startswith(("nccl", "cublas", "cudnn"))})
    blas_exports = sorted(n for n, lib in exported if lib == "cublas")
    blas_node = ["libcublas.so.13 {", "  global:", *[f"    {n};" for n in blas_exports], "};", ""] if blas_exports else []
    lt_exports = sorted({n for n, lib in exported if lib == "cublasLt"} | {n for n in hand_names if n.startswith("cublasLt")})
    if lt_exports:       # cuBLASLt's own version node, as the real libcublasLt.so.13 has
        blas_node += ["libcublasLt.so.13 {", "  global:", *[f"    {n};" for n in lt_exports], "};", ""]
    dnn_exports = sorted({n for n, lib in exported if lib == "cudnn"} | {n for n in hand_names if n.startswith("cudnn")})
    if dnn_exports:      # the real libcudnn.so.9 exports its API under a node of that name
        blas_node += ["libcudnn.so.9 {", "  global:", *[f"    {n};" for n in dnn_exports], "};", ""]
    mapfile = "\n".join([banner.rstrip("\n"), f"{soname} {{", "  global:", *[f"    {n};" for n in cuda_exports],
                         "};", "", *blas_node, "JITCKPT_REMOTE_1 {", "  global:", "    jitckpt_remote_*;",
                         "    jitckpt_phase_*;", "};", ""])

    disp = [banner, '#include "dispatch.h"', ""]
    syms = sorted(set(gen) | {"cudaStreamSynchronize"})
    for name in syms:
        disp.append(f"static __typeof__({name}) *real_{name};")
    disp.append("")
    for name, f in sorted(gen.items()):
        disp.append(proxy_dispatch_fn(f))
    disp.append("const struct dispatch_entry dispatch_generated[RFN_count] = {")
    for name in sorted(gen):
        disp.append(f"    [RFN_{name}] = {{{c_str(name)}, d_{name}}},")
    disp += ["};", "",
             "/* Resolves the real functions; returns how many the loaded libraries lack.  A missing",
             " * one is no error here: the program's call of it fails, naming it (dispatch_missing). */",
             "int dispatch_resolve(void *cudart, void *nccl, void *cublas, void *cudnn)", "{", "    int missing = 0;"]
    for name in syms:
        lib = ("nccl" if name.startswith("nccl") else "cublas" if name.startswith("cublas") else
               "cudnn" if name.startswith("cudnn") else "cudart")
        disp.append(f"    if ((real_{name} = (__typeof__({name}) *)proxy_sym({lib}, {c_str(name)})) == NULL)\n"
                    f"        missing += dispatch_note_missing({c_str(name)});")
    disp += ["    return missing;", "}", ""]
    return {"remote_fns.h": "\n".join(fns), "remote_stubs.c": "\n".join(stubs), "remote.map": mapfile,
            "proxy_dispatch.c": "\n".join(disp)}


def header_names(text: str) -> set[str]:
    """Every function name the CUDA runtime or NCCL header declares, parsed or not."""
    names = set(re.findall(r"\bCUDARTAPI\s+(\w+)\s*\(", text))
    names |= set(re.findall(r"\b(p?nccl[A-Z]\w*)\s*\(", text))
    return names
