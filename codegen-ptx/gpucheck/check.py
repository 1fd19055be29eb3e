"""Compare gpucheck results (argv[1]: the folder of NAME.bin files) with an exact reference:
rational arithmetic rounded per IEEE 754 and PTX's rules (float-to-integer NaN gives 0, or
1 << (bits - 1) from f64 or into 64-bit integers, per the PTX ISA 9.0). NaN results compare as
NaN whatever their payload. Prints mismatches and exits non-zero if there are any."""
import json, sys, os
from fractions import Fraction as F
from math import isqrt
D = os.path.dirname(os.path.abspath(__file__)); R = sys.argv[1]
N = 64
FMT = {"f16": (5, 10), "bf16": (8, 7), "f32": (8, 23), "f64": (11, 52)}
SIZE = {"s8":1,"u8":1,"s16":2,"u16":2,"f16":2,"bf16":2,"s32":4,"u32":4,"f32":4,"s64":8,"u64":8,"f64":8}
def bits_of(t): return SIZE[t]*8
def is_int(t): return t[0] in "su"
def signed(t): return t[0] == "s"
def rng(t):
    b = bits_of(t)
    return (-(1 << (b-1)), (1 << (b-1)) - 1) if signed(t) else (0, (1 << b) - 1)
def get(buf, off, t): return int.from_bytes(buf[off:off+SIZE[t]], "little")
def as_int(t, bits):
    b = bits_of(t)
    return bits - (1 << b) if signed(t) and bits >> (b-1) else bits
def from_int(t, v): return v % (1 << bits_of(t))
def decode(t, bits):
    e, m = FMT[t]; total = 1 + e + m; sign = bits >> (total-1); ex = (bits >> m) & ((1 << e)-1); man = bits & ((1 << m)-1)
    bias = (1 << (e-1)) - 1
    if ex == (1 << e) - 1: return ("nan",) if man else ("inf", sign)
    if ex == 0: return ("num", sign, F(man, 1 << m) * F(2)**(1-bias))
    return ("num", sign, (1 + F(man, 1 << m)) * F(2)**(ex-bias))
def NAN(t): return "nan"
def enc_inf(t, sign):
    e, m = FMT[t]; return (sign << (e+m)) | (((1 << e)-1) << m)
def encode(t, sign, x, mode):
    e, m = FMT[t]; bias = (1 << (e-1)) - 1; emin, emax = 1-bias, bias
    if x == 0: return sign << (e+m)
    ex = x.numerator.bit_length() - x.denominator.bit_length()
    if F(2)**ex > x: ex -= 1
    if F(2)**(ex+1) <= x: ex += 1
    ex = max(ex, emin)
    q = x / F(2)**(ex-m); n = q.numerator // q.denominator; rem = q - n
    up = {"rn": rem > F(1,2) or (rem == F(1,2) and n % 2 == 1), "rz": False,
          "rm": bool(sign) and rem > 0, "rp": (not sign) and rem > 0}[mode]
    n += up
    if n == 1 << (m+1): n >>= 1; ex += 1
    if ex > emax:
        to_inf = {"rn": True, "rz": False, "rm": bool(sign), "rp": not sign}[mode]
        if to_inf: return enc_inf(t, sign)
        return (sign << (e+m)) | ((((1 << e)-2)) << m) | ((1 << m)-1)
    if n < (1 << m): return (sign << (e+m)) | n
    return (sign << (e+m)) | ((ex+bias) << m) | (n - (1 << m))
def round_int(x, mode):  # x Fraction, mode rni/rzi/rmi/rpi
    fl = x.numerator // x.denominator; frac = x - fl
    if mode == "rmi": return fl
    if mode == "rpi": return fl + (frac > 0)
    if mode == "rzi": return fl if x >= 0 else fl + (frac > 0)
    return fl + (frac > F(1,2) or (frac == F(1,2) and fl % 2 == 1))
IR = {"rn": "rni", "rz": "rzi", "rm": "rmi", "rp": "rpi"}
def value(t, bits):  # ("int", v) or float decode
    return ("int", as_int(t, bits)) if is_int(t) else decode(t, bits)
def cvt(frm, to, rnd, sat, bits):
    v = value(frm, bits)
    if is_int(frm) and is_int(to):
        x = v[1]
        if sat:
            lo, hi = rng(to); x = min(max(x, lo), hi)
        return from_int(to, x)
    if not is_int(frm) and is_int(to):
        lo, hi = rng(to)
        if v[0] == "nan": return 0 if frm != "f64" and bits_of(to) != 64 else 1 << (bits_of(to) - 1)
        if v[0] == "inf": return from_int(to, lo if v[1] else hi)
        x = -v[2] if v[1] else v[2]
        return from_int(to, min(max(round_int(x, IR[rnd]), lo), hi))
    # float result
    if v[0] == "nan": return "nan"
    if v[0] == "inf": return enc_inf(to, v[1])
    if v[0] == "int": sign, x = (1 if v[1] < 0 else 0), F(abs(v[1]))
    else: sign, x = v[1], v[2]
    if frm == to and rnd is not None:
        y = round_int(-x if sign else x, IR[rnd]); return encode(to, sign, F(abs(y)), "rn")
    return encode(to, sign, x, rnd or "rn")
def same(t, exp, got):
    if exp == "nan": return not is_int(t) and decode(t, got)[0] == "nan"
    return exp == got
inp = open(os.path.join(D, "input.bin"), "rb").read()
in_off = json.load(open(os.path.join(D, "inputs.json")))
def inval(t, i): return get(inp, in_off[t] + i*SIZE[t], t)
fails = 0
def fail(msg):
    global fails
    fails += 1
    if fails <= 200: print("MISMATCH", msg)
for arch in ["sm_80", "sm_90"]:
    out = open(os.path.join(R, f"cvt_{arch}.bin"), "rb").read(); spec = json.load(open(os.path.join(D, f"cvt_{arch}.spec.json")))
    n0 = fails
    for frm, to, rnd, sat, off in spec:
        for i in range(N):
            b = inval(frm, i); exp = cvt(frm, to, rnd, sat, b); got = get(out, off + i*SIZE[to], to)
            if not same(to, exp, got):
                fail(f"{arch} cvt {frm}->{to} rnd={rnd} sat={sat} in=0x{b:x} exp={exp if exp=='nan' else hex(exp)} got=0x{got:x}")
    print(arch, "conversions:", len(spec), "x", N, "checked,", fails - n0, "mismatches")
# arithmetic
def fval(t, bits): return decode(t, bits)
def fnum(d): return (-d[2] if d[1] else d[2])
def fres(t, sign, x): return encode(t, sign, x, "rn")
def fadd(t, a, b):
    if a[0] == "nan" or b[0] == "nan": return "nan"
    if a[0] == "inf" and b[0] == "inf": return enc_inf(t, a[1]) if a[1] == b[1] else "nan"
    if a[0] == "inf": return enc_inf(t, a[1])
    if b[0] == "inf": return enc_inf(t, b[1])
    s = fnum(a) + fnum(b)
    if s == 0: return fres(t, 1 if (a[1] and b[1] and a[2] == 0 and b[2] == 0) else 0, F(0))
    return fres(t, 1 if s < 0 else 0, abs(s))
def neg(d): return d if d[0] == "nan" else (d[0], 1 - d[1]) + tuple(d[2:])
def fmul_exact(a, b):
    if a[0] == "nan" or b[0] == "nan": return ("nan",)
    s = a[1] ^ b[1]
    if a[0] == "inf" or b[0] == "inf":
        if (a[0] == "num" and a[2] == 0) or (b[0] == "num" and b[2] == 0): return ("nan",)
        return ("inf", s)
    return ("num", s, a[2]*b[2])
def fdiv(t, a, b):
    if a[0] == "nan" or b[0] == "nan": return "nan"
    s = a[1] ^ b[1]
    if a[0] == "inf": return "nan" if b[0] == "inf" else enc_inf(t, s)
    if b[0] == "inf": return fres(t, s, F(0))
    if b[2] == 0: return "nan" if a[2] == 0 else enc_inf(t, s)
    return fres(t, s, a[2]/b[2])
def fsqrt(t, a):
    if a[0] == "nan": return "nan"
    if a[0] == "inf": return "nan" if a[1] else enc_inf(t, 0)
    if a[2] == 0: return fres(t, a[1], F(0))
    if a[1]: return "nan"
    x = a[2]; k = 300; N2 = x.numerator * x.denominator * 4**k; r = isqrt(N2)
    v = F(r, x.denominator * 2**k) if r*r == N2 else F(2*r+1, 2 * x.denominator * 2**k)
    return fres(t, 0, v)
def ffma(t, a, b, c):
    p = fmul_exact(a, b)
    if p[0] == "nan" or c[0] == "nan": return "nan"
    if p[0] == "inf": return "nan" if c[0] == "inf" and c[1] != p[1] else enc_inf(t, p[1])
    if c[0] == "inf": return enc_inf(t, c[1])
    s = fnum(p) + fnum(c)
    if s == 0: return fres(t, 1 if (p[1] and c[1] and p[2] == 0 and c[2] == 0) else 0, F(0))
    return fres(t, 1 if s < 0 else 0, abs(s))
def fcmp(op, a, b):
    un = a[0] == "nan" or b[0] == "nan"
    if op == "nan": return un
    if op == "neu": return un or fkey(a) != fkey(b)
    if un: return False
    x, y = fkey(a), fkey(b)
    return {"eq": x == y, "ne": x != y, "lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y}[op]
def fkey(d):
    if d[0] == "inf": return F(-10**400) if d[1] else F(10**400)
    return fnum(d)
def fminmax(t, op, a, b, ab, bb):
    if a[0] == "nan" and b[0] == "nan": return "nan"
    if a[0] == "nan": return bb
    if b[0] == "nan": return ab
    x, y = fkey(a), fkey(b)
    if x == y: return ("either", ab, bb)
    return ab if (x < y) == (op == "min") else bb
def iop(t, op, a, b, c, amt):
    w = bits_of(t); A, B, C = as_int(t, a), as_int(t, b), as_int(t, c)
    if op in ("add", "sub", "mul", "fma"):
        return from_int(t, {"add": A+B, "sub": A-B, "mul": A*B, "fma": A*B+C}[op])
    if op == "mulhi": return from_int(t, (A*B) >> w)
    if op in ("div", "rem"):
        if B == 0 or (signed(t) and A == rng(t)[0] and B == -1): return None
        q = abs(A) // abs(B) * (1 if (A < 0) == (B < 0) else -1)
        return from_int(t, q if op == "div" else A - q*B)
    if op == "min": return from_int(t, min(A, B))
    if op == "max": return from_int(t, max(A, B))
    if op == "and": return a & b
    if op == "or": return a | b
    if op == "xor": return a ^ b
    if op == "shl": return 0 if amt >= w else from_int(t, a << amt)
    if op == "shr": return from_int(t, A >> min(amt, w)) if signed(t) else (0 if amt >= w else a >> amt)
    if op == "neg": return from_int(t, -A)
    if op == "abs": return from_int(t, abs(A))
    if op == "not": return from_int(t, ~a)
    if op == "popc": return bin(a).count("1")
    if op == "clz": return w - a.bit_length()
    if op.startswith("cmp."):
        o = op[4:]; return int({"eq": A == B, "ne": A != B, "lt": A < B, "le": A <= B, "gt": A > B, "ge": A >= B}[o])
    raise ValueError(op)
out = open(os.path.join(R, "arith.bin"), "rb").read(); spec = json.load(open(os.path.join(D, "arith.spec.json")))
n0 = fails
for t, op, rt, off in spec:
    for i in range(N):
        ia, ib, ic = i, (i*7+3) % N, (i*13+5) % N
        a, b, c = inval(t, ia), inval(t, ib), inval(t, ic); amt = (i*7+3) % 71
        got = get(out, off + i*SIZE[rt], rt)
        if is_int(t):
            exp = iop(t, op, a, b, c, amt)
            if exp is None: continue
        else:
            A, B, C = fval(t, a), fval(t, b), fval(t, c)
            if op == "add": exp = fadd(t, A, B)
            elif op == "sub": exp = fadd(t, A, neg(B))
            elif op == "mul":
                p = fmul_exact(A, B); exp = "nan" if p[0] == "nan" else enc_inf(t, p[1]) if p[0] == "inf" else fres(t, p[1], p[2])
            elif op == "div": exp = fdiv(t, A, B)
            elif op == "rcp": exp = fdiv(t, ("num", 0, F(1)), A)
            elif op == "sqrt": exp = fsqrt(t, A)
            elif op == "fma": exp = ffma(t, A, B, C)
            elif op in ("min", "max"): exp = fminmax(t, op, A, B, a, b)
            elif op == "neg": exp = "nan" if A[0] == "nan" else a ^ (1 << (bits_of(t)-1))
            elif op == "abs": exp = "nan" if A[0] == "nan" else a & ((1 << (bits_of(t)-1)) - 1)
            elif op.startswith("cmp."): exp = int(fcmp(op[4:], A, B))
            else: raise ValueError(op)
        if isinstance(exp, tuple):
            ok = got in exp[1:]
        else:
            ok = same(rt, exp, got)
        if not ok:
            fail(f"arith {t} {op} a=0x{a:x} b=0x{b:x} c=0x{c:x} amt={amt} exp={exp if not isinstance(exp, int) else hex(exp)} got=0x{got:x}")
print("arith:", len(spec), "ops x", N, "checked,", fails - n0, "mismatches")
out = open(os.path.join(R, "misc.bin"), "rb").read(); spec = json.load(open(os.path.join(D, "misc.spec.json")))
n0 = fails
for off, t, v in spec:
    if v == 2**64 - 1:  # s8 sign extension
        for i in range(N):
            exp = from_int("s32", as_int("s8", inval("s8", i))); got = get(out, off + 4*i, "s32")
            if exp != got: fail(f"misc s8->s32 i={i} exp={exp:x} got={got:x}")
    elif v == 2**64 - 2:  # negative ptradd
        for i in range(N):
            exp = inval("f32", 7 + i) if 7 + i < N else None; got = get(out, off + 4*i, "f32")
            if exp is not None and exp != got: fail(f"misc ptradd i={i} exp={exp:x} got={got:x}")
    elif v == 2**64 - 3:  # v4 f64 copy
        for i in range(N):
            for k in range(4):
                exp = inval("f64", 4*(i % 16) + k); got = get(out, off + 8*(4*i+k), "f64")
                if exp != got: fail(f"misc v4.f64 i={i} k={k} exp={exp:x} got={got:x}")
    else:
        got = get(out, off, t)
        if got != v: fail(f"misc at {off} ({t}): exp={v:#x} got={got:#x}")
print("misc:", len(spec), "checks,", fails - n0, "mismatches")
print("TOTAL MISMATCHES:", fails)
sys.exit(1 if fails else 0)
