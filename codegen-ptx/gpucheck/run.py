"""Run the gpucheck bundle (see codegen-ptx/examples/gpucheck.rs) on a CUDA GPU through the
driver API (ctypes, no other dependency); writes NAME.bin per case into argv[1] or $OUT."""
import ctypes, json, os, sys
from ctypes import c_int, c_uint, c_uint64, c_size_t, c_void_p, c_char_p, byref, POINTER
d = os.path.dirname(os.path.abspath(__file__)); out = sys.argv[1] if len(sys.argv) > 1 else os.environ["OUT"]
cuda = ctypes.CDLL("libcuda.so.1")
P = c_void_p
sigs = {
 "cuInit": [c_uint], "cuDeviceGet": [POINTER(c_int), c_int],
 "cuDevicePrimaryCtxRetain": [POINTER(P), c_int], "cuCtxSetCurrent": [P],
 "cuModuleLoadDataEx": [POINTER(P), c_char_p, c_uint, P, P], "cuModuleGetFunction": [POINTER(P), P, c_char_p],
 "cuMemAlloc_v2": [POINTER(c_uint64), c_size_t], "cuMemcpyHtoD_v2": [c_uint64, c_void_p, c_size_t],
 "cuMemcpyDtoH_v2": [c_void_p, c_uint64, c_size_t], "cuMemsetD8_v2": [c_uint64, ctypes.c_ubyte, c_size_t],
 "cuLaunchKernel": [P, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, P, POINTER(P), P],
 "cuCtxSynchronize": [], "cuGetErrorString": [c_int, POINTER(c_char_p)], "cuModuleUnload": [P], "cuMemFree_v2": [c_uint64],
}
for n, a in sigs.items():
    getattr(cuda, n).argtypes = a; getattr(cuda, n).restype = c_int
def ck(r, what):
    if r != 0:
        s = c_char_p(); cuda.cuGetErrorString(r, byref(s)); raise RuntimeError(f"{what}: error {r} {s.value}")
ck(cuda.cuInit(0), "init"); dev = c_int(); ck(cuda.cuDeviceGet(byref(dev), 0), "dev")
ctx = P(); ck(cuda.cuDevicePrimaryCtxRetain(byref(ctx), dev), "ctx"); ck(cuda.cuCtxSetCurrent(ctx), "set")
inp = open(os.path.join(d, "input.bin"), "rb").read()
for case in json.load(open(os.path.join(d, "cases.json"))):
    try:
        ptx = open(os.path.join(d, case["ptx"]), "rb").read() + b"\0"
        # JIT error log
        CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6
        logbuf = ctypes.create_string_buffer(65536)
        opts = (c_int * 2)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        vals = (P * 2)(ctypes.cast(logbuf, P), P(65536))
        mod = P(); r = cuda.cuModuleLoadDataEx(byref(mod), ptx, 2, ctypes.cast(opts, P), ctypes.cast(vals, P))
        if r != 0: print(case["name"], "JIT log:", logbuf.value.decode(errors="replace"))
        ck(r, "load " + case["name"])
        f = P(); ck(cuda.cuModuleGetFunction(byref(f), mod, case["name"].encode()), "func")
        din = c_uint64(); dout = c_uint64(); n = case["out_bytes"]
        ck(cuda.cuMemAlloc_v2(byref(din), len(inp)), "alloc"); ck(cuda.cuMemAlloc_v2(byref(dout), n), "alloc")
        ck(cuda.cuMemcpyHtoD_v2(din.value, inp, len(inp)), "h2d"); ck(cuda.cuMemsetD8_v2(dout.value, 0, n), "memset")
        params = (P * 2)(ctypes.cast(byref(din), P), ctypes.cast(byref(dout), P))
        ck(cuda.cuLaunchKernel(f, case["grid"], 1, 1, case["block"], 1, 1, case["dyn"], None, params, None), "launch")
        ck(cuda.cuCtxSynchronize(), "sync " + case["name"])
        buf = ctypes.create_string_buffer(n); ck(cuda.cuMemcpyDtoH_v2(buf, dout.value, n), "d2h")
        open(os.path.join(out, case["name"] + ".bin"), "wb").write(buf.raw)
        cuda.cuMemFree_v2(din.value); cuda.cuMemFree_v2(dout.value); cuda.cuModuleUnload(mod)
        print(case["name"], "ran")
    except Exception as e:
        print(case["name"], "FAILED", e)
