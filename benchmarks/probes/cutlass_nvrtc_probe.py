#!/usr/bin/env python3
"""Can CUTLASS / CuTe's arch-level headers replace fullfuse's hand-written PTX wrappers under NVRTC?  Measures, on the
host (no GPU needed: NVRTC compiles to sm_90a cubins, nvdisasm reads them):

  1. whether a unit that includes each header (cute/arch/mma_sm90_gmma.hpp, cute/arch/copy_sm90_tma.hpp,
     cutlass/arch/barrier.h, cute/arch/copy_sm80.hpp, cute/arch/copy_sm75.hpp for ldmatrix, and all of them) compiles
     under NVRTC for sm_90a, with which include directories (libcu++ / CCCL) and with the project's device_std.h shim;
  2. the extra compile time: a small wgmma + TMA + mbarrier kernel with and without each include (median of --reps
     compiles, wall and this process's CPU seconds: NVRTC runs in-process), and the real family-A unit
     fa_wgmma_kernel<0, false, 6, 10, 3, false> with and without all of them;
  3. instruction equivalence: tiny kernels that differ only in the wrapper (fullfuse's own, copied below from
     csrc/fused_conv_act_pool/sm90_ptx.cuh, ring_loaders.cuh and the family-B source, vs CuTe's / CUTLASS's), compiled
     to cubin and disassembled; the SASS streams are compared by opcode + modifiers and in full text; and real family-A
     kernels built from a copy of csrc whose sm90_ptx.cuh / ldmatrix-stmatrix are routed through CuTe instead.

    python3 benchmarks/probes/cutlass_nvrtc_probe.py [--cccl DIR] [--nvdisasm PATH] [--reps 3] [--no-real] [--keep DIR]

--cccl: the include directory of the nvidia-cuda-cccl wheel (the folder holding cccl/; default: found in site-packages,
CUDA_HOME, /usr/local/cuda*); --nvdisasm: default found on PATH, in site-packages nvidia/cu13/bin, CUDA_HOME/bin.
Nothing in the repository is written: csrc is copied to a temporary folder (and, if it still includes <stdint.h> /
<type_traits> / <cuda.h> / <cuda_runtime.h>, those lines become #include "device_std.h", as the NVRTC build does).
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARCH = "sm_90a"

HEADERS = ["cute/arch/mma_sm90_gmma.hpp", "cute/arch/copy_sm90_tma.hpp", "cutlass/arch/barrier.h",
           "cute/arch/copy_sm80.hpp", "cute/arch/copy_sm75.hpp"]
ALL = "all five"


# ----------------------------------------------------------------------------------------------------------- paths
def site_dirs():
    return [Path(p) for p in sys.path if p and Path(p).is_dir()]


def cuda_include() -> str:
    for base in site_dirs():
        for sub in ("cu13", "cu12", "cuda_runtime"):
            inc = base / "nvidia" / sub / "include"
            if (inc / "cuda_fp16.h").is_file():
                return str(inc)
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    return str(Path(home) / "include")


def cutlass_include() -> str:
    import cutlass_library
    return str(Path(cutlass_library.source_path) / "include")


def find_cccl(arg):
    """The folder that holds cccl/cuda/std (the nvidia-cuda-cccl wheel's include dir, or a CUDA 13 toolkit's)."""
    cands = [arg] if arg else []
    cands += [str(b / "nvidia" / s / "include") for b in site_dirs() for s in ("cu13", "cu12", "cuda_cccl")]
    cands += [os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "include")]
    cands += sorted(glob.glob("/usr/local/cuda*/include")) + sorted(glob.glob("/usr/local/cuda*/targets/*/include"))
    for c in cands:
        if c and Path(c, "cccl", "cuda", "std", "cstdint").is_file():
            return c
    return None


def find_tool(name, arg):
    if arg:
        return arg
    p = shutil.which(name)
    if p:
        return p
    for b in site_dirs():
        for s in ("cu13", "cu12", "cuda_nvdisasm", "cuda_cuobjdump"):
            c = b / "nvidia" / s / "bin" / name
            if c.is_file():
                return str(c)
    for c in [os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "bin", name)] + \
            sorted(glob.glob(f"/usr/local/cuda*/bin/{name}")):
        if os.path.isfile(c):
            return c
    return None


# --------------------------------------------------------------------------------------------------------- compile
def nvrtc_version():
    from cuda.bindings import nvrtc
    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def compile_unit(src, includes, names=(), bundled=False):
    """(ok, cubin bytes or error log, wall s, cpu s)."""
    from cuda.core import Program, ProgramOptions
    opts = ProgramOptions(std="c++17", arch=ARCH, include_path=list(includes), device_as_default_execution_space=True,
                          lineinfo=True, use_bundled_headers=True if bundled else None)
    t0, c0 = time.perf_counter(), cpu_seconds()
    try:
        code = Program(src, "c++", options=opts).compile("cubin", name_expressions=tuple(names))
        ok, out = True, bytes(code.code)
    except Exception as exc:  # NVRTC_ERROR_COMPILATION and its log
        ok, out = False, str(exc)
    return ok, out, time.perf_counter() - t0, cpu_seconds() - c0


def first_errors(log, n=2):
    lines = [ln.strip() for ln in log.splitlines()]
    errs = [ln for ln in lines if re.search(r"(catastrophic )?error", ln) and not ln.startswith("1 ")
            and "NVRTC_ERROR" not in ln and "errors detected" not in ln and "error detected" not in ln]
    return " | ".join(e[:170] for e in errs[:n]) or (lines[0][:200] if lines else "?")


def timed(builds, reps):
    """Compile every (src, includes, names) of builds reps times, interleaved (rep 1 of each, then rep 2, ...) so that
    a change of the machine's load hits them alike.  Per build: (median wall, median cpu, min cpu) or the error log."""
    res = [[] for _ in builds]
    err = [None] * len(builds)
    for _ in range(reps):
        for k, (src, inc, names) in enumerate(builds):
            if err[k] is not None:
                continue
            ok, out, w, c = compile_unit(src, inc, names)
            if ok:
                res[k].append((w, c))
            else:
                err[k] = out
    return [(statistics.median(w for w, _ in r), statistics.median(c for _, c in r), min(c for _, c in r))
            if e is None else e for r, e in zip(res, err)]


def timing_rows(labels, results, base):
    rows = []
    for lab, r in zip(labels, results):
        if isinstance(r, str):
            rows.append((lab, "FAIL", "-", "-", "-", first_errors(r)))
            continue
        w, c, m = r
        extra = "-" if base is None or r is base or isinstance(base, str) else \
            f"{w - base[0]:+.2f} / {c - base[1]:+.2f} / {m - base[2]:+.2f}"
        rows.append((lab, f"{w:.2f}", f"{c:.2f}", f"{m:.2f}", extra, ""))
    return rows


TIME_HEADER = ("unit", "wall s (median)", "cpu s (median)", "cpu s (min)", "extra: wall / cpu / min cpu", "error")


# ---------------------------------------------------------------------------------------------------- disassembly
def sass(cubin, nvdisasm, tmp):
    """Instruction texts (predicate, opcode.modifiers, operands) of every function, NOPs after the last EXIT/BRA
    self-loop dropped."""
    path = Path(tmp) / f"u{abs(hash(cubin)) % 10**12}.cubin"
    path.write_bytes(cubin)
    out = subprocess.run([nvdisasm, "-c", str(path)], capture_output=True, text=True, check=True).stdout
    ins = []
    for line in out.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m:
            ins.append(re.sub(r"\s+", " ", m.group(1)))
    while ins and ins[-1] == "NOP":
        ins.pop()
    return ins


def opcode(ins):
    t = ins.split()
    pred = t[0] if t[0].startswith("@") else ""
    op = t[1] if pred else t[0]
    return (pred[:1] + "P " if pred else "") + op  # '@P ' marks a guarded instruction, whatever the predicate


def compare(a, b):
    """(verdict, details) for two instruction lists: a = fullfuse, b = CuTe / CUTLASS."""
    spills = lambda x: sum(1 for i in x if re.search(r"\b(STL|LDL)", i))
    sp = f"; local-memory spill instructions {spills(a)} vs {spills(b)}" if spills(a) or spills(b) else ""
    if a == b:
        return "identical", f"{len(a)} instructions, same text"
    oa, ob = [opcode(i) for i in a], [opcode(i) for i in b]
    if oa == ob:
        return "same opcodes", f"{len(a)} instructions; operands / registers differ{sp}"
    ca, cb = collections.Counter(oa), collections.Counter(ob)
    if ca == cb:
        return "same opcode counts", f"{len(a)} instructions, scheduled in another order{sp}"
    only = "; ".join(f"-{k}" + (f" x{v}" if v > 1 else "") for k, v in (ca - cb).items())
    plus = "; ".join(f"+{k}" + (f" x{v}" if v > 1 else "") for k, v in (cb - ca).items())
    return "DIFFERENT", f"{len(a)} vs {len(b)} instructions{sp}; ff only: {only or '-'}; cute only: {plus or '-'}"


def key_lines(ins, pats):
    return [i for i in ins if any(p in i for p in pats)]


# ------------------------------------------------------------------------------------- fullfuse's wrappers (copy)
# From csrc/fused_conv_act_pool/sm90_ptx.cuh (family A), csrc/fused_convt_pool_reduce (family B, fb_wgmma n96) and
# ring_loaders.cuh (wg_tnchw16_move's ldmatrix / stmatrix), verbatim apart from the names of the two helper macros.
FF_WRAPPERS = r'''
//@head
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_HAVE_WGMMA 1
#endif
__device__ __forceinline__ uint32_t probe_smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
//@wgmma
#ifdef FA_HAVE_WGMMA
#define FA_ACC_REGS_LO \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define FA_ACC_REGS_HI \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define FA_ACC_OPS_LO \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FA_ACC_OPS_HI \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define FA_WGMMA_SS(NAME, REGS, IA, IB, IS, SHAPE_TYPES, TAIL, ...)                                           \
  __device__ __forceinline__ void NAME(float* d, uint64_t da, uint64_t db, int scale_d) {                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IS ", 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned." SHAPE_TYPES " {" REGS "}, " IA ", " IB ", p, " TAIL ";\n}\n"  \
                 : __VA_ARGS__                                                                                \
                 : "l"(da), "l"(db), "r"(scale_d));                                                           \
  }
#define FA_N128 FA_ACC_REGS_LO "," FA_ACC_REGS_HI, "%64", "%65", "%66"
#define FA_N64 FA_ACC_REGS_LO, "%32", "%33", "%34"
#define FA_WGMMA_SS_X(...) FA_WGMMA_SS(__VA_ARGS__)
FA_WGMMA_SS_X(wgh_tf32, FA_N128, "m64n128k8.f32.tf32.tf32", "1, 1", FA_ACC_OPS_LO, FA_ACC_OPS_HI)
FA_WGMMA_SS_X(wgh_bf16, FA_N128, "m64n128k16.f32.bf16.bf16", "1, 1, 0, 0", FA_ACC_OPS_LO, FA_ACC_OPS_HI)
FA_WGMMA_SS_X(wgh_f16, FA_N128, "m64n128k16.f32.f16.f16", "1, 1, 0, 0", FA_ACC_OPS_LO, FA_ACC_OPS_HI)
FA_WGMMA_SS_X(wgh_tf32_n64, FA_N64, "m64n64k8.f32.tf32.tf32", "1, 1", FA_ACC_OPS_LO)
FA_WGMMA_SS_X(wgh_bf16_n64, FA_N64, "m64n64k16.f32.bf16.bf16", "1, 1, 0, 0", FA_ACC_OPS_LO)
FA_WGMMA_SS_X(wgh_f16_n64, FA_N64, "m64n64k16.f32.f16.f16", "1, 1, 0, 0", FA_ACC_OPS_LO)
#undef FA_WGMMA_SS_X
#undef FA_WGMMA_SS
#undef FA_N128
#undef FA_N64
// family B: m64n96 (48 accumulators)
#define FB_WGMMA_N96(NAME, SHAPE_TYPES, TAIL)                                                                    \
  __device__ __forceinline__ void NAME(float (&d)[48], uint64_t da, uint64_t db, int scale_d) {                  \
    asm volatile(                                                                                                 \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"                                                            \
        "wgmma.mma_async.sync.aligned." SHAPE_TYPES " "                                                          \
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27," \
        "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, %48, %49, p, " TAIL   \
        ";\n}\n"                                                                                                 \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]) \
        : "l"(da), "l"(db), "r"(scale_d));                                                                       \
  }
FB_WGMMA_N96(fb_wgmma_tf32, "m64n96k8.f32.tf32.tf32", "1, 1")
FB_WGMMA_N96(fb_wgmma_bf16, "m64n96k16.f32.bf16.bf16", "1, 1, 0, 0")
#undef FB_WGMMA_N96
#endif
//@sync
#ifdef FA_HAVE_WGMMA
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
template <int N> __device__ __forceinline__ void fb_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }
#endif
//@cpwait
__device__ __forceinline__ void cp_wait_n(int n) {   // cp.async.wait_group needs an immediate
  switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
  }
}
__device__ __forceinline__ void probe_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
//@cp
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
// (not in fullfuse: its form for a 16-byte .ca copy, to set against CuTe's SM80_CP_ASYNC_CACHEALWAYS_ZFILL)
__device__ __forceinline__ void probe_cp_async16_ca(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
//@mbar_init
__device__ __forceinline__ void mbar_init(uint32_t a, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(a), "r"(count) : "memory");
}
//@mbar_wait
__device__ __forceinline__ void mbar_wait(uint32_t a, unsigned parity) {
  asm volatile("{\n.reg .pred P1;\nMBAR_WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               "@!P1 bra MBAR_WAIT;\n}" :: "r"(a), "r"(parity) : "memory");
}
//@mbar_tx
__device__ __forceinline__ void mbar_expect_tx(uint32_t a, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(a), "r"(bytes) : "memory");
}
//@tma
__device__ __forceinline__ void tma_load4(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_load5(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar) : "memory");
}
//@ldst
__device__ __forceinline__ void probe_ldsm_x4_trans(uint32_t src, uint32_t (&v)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(src));
}
__device__ __forceinline__ void probe_stsm_x4(uint32_t dst, const uint32_t (&v)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};"
               :: "r"(dst), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]) : "memory");
}
'''

# The same groups through CuTe / CUTLASS (same names and signatures as sm90_ptx.cuh: 32-bit shared addresses in,
# turned back into generic pointers for CuTe, which converts them again; ptxas folds the round trip)
CUTE_GROUPS = r'''
//@wgmma
#ifdef FA_HAVE_WGMMA
#define FA_SC static_cast<cute::SM90::GMMA::ScaleOut>(scale_d)
#define FA_KM cute::SM90::GMMA::Major::K
__device__ __forceinline__ void wgh_tf32(float* d, uint64_t da, uint64_t db, int scale_d) {
  cute::SM90::GMMA::MMA_64x128x8_F32TF32TF32_SS_TN<>::fma(da, db, D64, FA_SC); }
__device__ __forceinline__ void wgh_bf16(float* d, uint64_t da, uint64_t db, int scale_d) {
  cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<FA_KM, FA_KM>::fma(da, db, D64, FA_SC); }
__device__ __forceinline__ void wgh_f16(float* d, uint64_t da, uint64_t db, int scale_d) {
  cute::SM90::GMMA::MMA_64x128x16_F32F16F16_SS<FA_KM, FA_KM>::fma(da, db, D64, FA_SC); }
__device__ __forceinline__ void wgh_tf32_n64(float* d, uint64_t da, uint64_t db, int scale_d) {
  cute::SM90::GMMA::MMA_64x64x8_F32TF32TF32_SS_TN<>::fma(da, db, D32, FA_SC); }
__device__ __forceinline__ void wgh_bf16_n64(float* d, uint64_t da, uint64_t db, int scale_d) {
  cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<FA_KM, FA_KM>::fma(da, db, D32, FA_SC); }
__device__ __forceinline__ void wgh_f16_n64(float* d, uint64_t da, uint64_t db, int scale_d) {
  cute::SM90::GMMA::MMA_64x64x16_F32F16F16_SS<FA_KM, FA_KM>::fma(da, db, D32, FA_SC); }
#endif
//@sync
#ifdef FA_HAVE_WGMMA
__device__ __forceinline__ void wg_fence() { cute::warpgroup_arrive(); }
__device__ __forceinline__ void wg_commit() { cute::warpgroup_commit_batch(); }
__device__ __forceinline__ void wg_wait0() { cute::warpgroup_wait<0>(); }
#endif
//@cpwait
__device__ __forceinline__ void cp_wait_n(int n) {
  switch (n) {
    case 0: cute::cp_async_wait<0>(); break;
    case 1: cute::cp_async_wait<1>(); break;
    case 2: cute::cp_async_wait<2>(); break;
    case 3: cute::cp_async_wait<3>(); break;
    case 4: cute::cp_async_wait<4>(); break;
    case 5: cute::cp_async_wait<5>(); break;
    case 6: cute::cp_async_wait<6>(); break;
    default: cute::cp_async_wait<7>(); break;
  }
}
//@cp
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool ok) {
  cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(*reinterpret_cast<const cute::uint128_t*>(src),
                                                              *reinterpret_cast<cute::uint128_t*>(FA_GEN(dst)), ok);
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool ok) {
  cute::SM80_CP_ASYNC_CACHEALWAYS_ZFILL<uint32_t>::copy(*reinterpret_cast<const uint32_t*>(src),
                                                       *reinterpret_cast<uint32_t*>(FA_GEN(dst)), ok);
}
//@mbar_init
__device__ __forceinline__ void mbar_init(uint32_t a, unsigned count) {
  cutlass::arch::ClusterBarrier::init(reinterpret_cast<uint64_t*>(FA_GEN(a)), count); }
//@mbar_wait
__device__ __forceinline__ void mbar_wait(uint32_t a, unsigned parity) {
  cutlass::arch::ClusterBarrier::wait(reinterpret_cast<uint64_t*>(FA_GEN(a)), parity); }
//@mbar_tx
__device__ __forceinline__ void mbar_expect_tx(uint32_t a, unsigned bytes) {
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(reinterpret_cast<uint64_t*>(FA_GEN(a)), bytes); }
//@tma
#define FA_HINT static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL)
__device__ __forceinline__ void tma_load4(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2, int c3) {
  cute::SM90_TMA_LOAD_4D::copy(map, reinterpret_cast<uint64_t*>(FA_GEN(bar)), FA_HINT, FA_GEN(dst), c0, c1, c2, c3); }
__device__ __forceinline__ void tma_load5(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2, int c3, int c4) {
  cute::SM90_TMA_LOAD_5D::copy(map, reinterpret_cast<uint64_t*>(FA_GEN(bar)), FA_HINT, FA_GEN(dst), c0, c1, c2, c3, c4); }
'''.replace("D64", ", ".join(f"d[{i}]" for i in range(64))).replace("D32", ", ".join(f"d[{i}]" for i in range(32)))


def groups(text):
    parts = re.split(r"^//@(\w+)\n", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


FF_G, CUTE_G = groups(FF_WRAPPERS), groups(CUTE_GROUPS)
# the CUTLASS / CuTe headers each group needs (ldst: ldmatrix in copy_sm75, stmatrix in copy_sm90 <- copy_sm90_tma)
GROUP_HEADERS = {"wgmma": ["cute/arch/mma_sm90_gmma.hpp"], "sync": ["cute/arch/mma_sm90_gmma.hpp"],
                 "cpwait": ["cute/arch/copy_sm80.hpp"], "cp": ["cute/arch/copy_sm80.hpp"],
                 "mbar_init": ["cutlass/arch/barrier.h"], "mbar_tx": ["cutlass/arch/barrier.h"],
                 "mbar_wait": ["cutlass/arch/barrier.h"], "tma": ["cute/arch/copy_sm90_tma.hpp"],
                 "ldst": ["cute/arch/copy_sm75.hpp", "cute/arch/copy_sm90_tma.hpp"]}

CUTE_INCLUDES = "".join(f"#include <{h}>\n" for h in HEADERS)


def dlist(n):
    return ", ".join(f"d[{i}]" for i in range(n))


# ------------------------------------------------------------------------------------------ the equivalence tests
# Each test body has USE_CUTE 0 / 1 branches; everything outside them is common to both builds.
def wgmma_test(ff_call, cute_type, nacc):
    return f'''
extern "C" __global__ void __launch_bounds__(128) k(const uint64_t* __restrict__ desc, float* __restrict__ out, int n) {{
  float d[{nacc}];
#pragma unroll
  for (int i = 0; i < {nacc}; ++i) d[i] = 0.f;
  wg_fence();
#pragma unroll
  for (int j = 0; j < 4; ++j) {{
    const uint64_t da = desc[2 * j], db = desc[2 * j + 1];
#if USE_CUTE
    {cute_type}::fma(da, db, {dlist(nacc)}, static_cast<cute::SM90::GMMA::ScaleOut>(n > j));
#else
    {ff_call}(d, da, db, n > j);
#endif
  }}
  wg_commit();
  wg_wait0();
#pragma unroll
  for (int i = 0; i < {nacc}; ++i) out[threadIdx.x * {nacc} + i] = d[i];
}}
'''


SYNC_TEST = '''
extern "C" __global__ void __launch_bounds__(128) k(const uint64_t* __restrict__ desc, float* __restrict__ out, int n) {
  float d[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d[i] = 0.f;
#if USE_CUTE
#define FENCE() cute::warpgroup_arrive()
#define COMMIT() cute::warpgroup_commit_batch()
#define WAIT1() cute::warpgroup_wait<1>()
#define WAIT0() cute::warpgroup_wait<0>()
#else
#define FENCE() wg_fence()
#define COMMIT() wg_commit()
#define WAIT1() fb_wait<1>()
#define WAIT0() wg_wait0()
#endif
  FENCE();
  wgh_tf32(d, desc[0], desc[1], n > 0);
  wgh_tf32(d, desc[2], desc[3], 1);
  COMMIT();
  FENCE();
  wgh_tf32(d, desc[4], desc[5], 1);
  COMMIT();
  WAIT1();
  WAIT0();
#pragma unroll
  for (int i = 0; i < 64; ++i) out[threadIdx.x * 64 + i] = d[i];
}
'''

TMA_FF = {"init": "mbar_init(sb, 1);", "tx": "mbar_expect_tx(sb, bytes);", "wait": "mbar_wait(sb, parity);",
          "tma4": "tma_load4(sd, &map, sb, c0, c1, c2, c3);", "tma5": "tma_load5(sd, &map, sb, c0, c1, c2, c3, c4);"}
TMA_ALT = {
    "init": {"cutlass": "cutlass::arch::ClusterBarrier::init(&bar, 1);", "cute": "cute::initialize_barrier(bar, 1);"},
    "tx": {"cutlass": "cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&bar, bytes);",
           "cute": "cute::set_barrier_transaction_bytes(bar, bytes);"},
    "wait": {"cutlass": "cutlass::arch::ClusterBarrier::wait(&bar, parity);", "cute": "cute::wait_barrier(bar, parity);"},
    "tma4": {"cute": "cute::SM90_TMA_LOAD_4D::copy(&map, &bar, static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL), "
                     "buf, c0, c1, c2, c3);"},
    "tma5": {"cute": "cute::SM90_TMA_LOAD_5D::copy(&map, &bar, static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL), "
                     "buf, c0, c1, c2, c3, c4);"},
}


def tma_test(vary, dims=4):
    """vary: {op: 'cutlass' | 'cute'} for the ops (init, tx, wait, tma4 / tma5) whose USE_CUTE build takes the
    CUTLASS / CuTe call; the others are fullfuse's in both builds."""
    def op(name):
        if name in vary:
            return f"\n#if USE_CUTE\n    {TMA_ALT[name][vary[name]]}\n#else\n    {TMA_FF[name]}\n#endif\n"
        return "    " + TMA_FF[name]
    t = f"tma{dims}"
    return f'''
extern "C" __global__ void __launch_bounds__(128) k(const __grid_constant__ CUtensorMap map, float* __restrict__ out,
                                                    int c0, int c1, int c2, int c3, int c4, unsigned bytes, unsigned parity) {{
  __shared__ alignas(128) float buf[2048];
  __shared__ alignas(8) uint64_t bar;
  const uint32_t sb = probe_smem_u32(&bar), sd = probe_smem_u32(buf);
  if (threadIdx.x == 0) {{
{op("init")}
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }}
  __syncthreads();
  if (threadIdx.x == 0) {{
{op("tx")}
{op(t)}
  }}
{op("wait")}
  out[blockIdx.x * 128 + threadIdx.x] = buf[threadIdx.x * 3];
}}
'''


def cp_test(kind):
    """kind: cg16 / ca16 / ca4 (the copy varies), sync (commit / wait vary around fullfuse's cg16)."""
    T = "float" if kind == "ca4" else "float4"
    ff = {"cg16": "cp_async16", "ca16": "probe_cp_async16_ca", "ca4": "cp_async4", "sync": "cp_async16"}[kind]
    cu = {"cg16": "cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>",
          "ca16": "cute::SM80_CP_ASYNC_CACHEALWAYS_ZFILL<cute::uint128_t>",
          "ca4": "cute::SM80_CP_ASYNC_CACHEALWAYS_ZFILL<uint32_t>", "sync": None}[kind]
    ct = "uint32_t" if kind == "ca4" else "cute::uint128_t"
    copy_cute = (f"{cu}::copy(*reinterpret_cast<const {ct}*>(src + i), *reinterpret_cast<{ct}*>(&buf[i]), ok);"
                 if cu else f"{ff}(probe_smem_u32(&buf[i]), src + i, ok);")
    sync_ff = ("probe_cp_commit();", "cp_wait_n(1);", "cp_wait_n(0);")
    sc = ("cute::cp_async_fence();", "cute::cp_async_wait<1>();", "cute::cp_async_wait<0>();") if kind == "sync" \
        else sync_ff
    return f'''
extern "C" __global__ void __launch_bounds__(128) k(const {T}* __restrict__ src, {T}* __restrict__ out, int n) {{
  __shared__ alignas(16) {T} buf[256];
  for (int h = 0; h < 2; ++h) {{
    const int i = h * 128 + threadIdx.x;
    const bool ok = i < n;
#if USE_CUTE
    {copy_cute}
    {sc[0]}
#else
    {ff}(probe_smem_u32(&buf[i]), src + i, ok);
    {sync_ff[0]}
#endif
  }}
#if USE_CUTE
  {sc[1]}
#else
  {sync_ff[1]}
#endif
  out[threadIdx.x] = buf[threadIdx.x ^ 1];
#if USE_CUTE
  {sc[2]}
#else
  {sync_ff[2]}
#endif
  __syncthreads();
  out[128 + threadIdx.x] = buf[128 + (threadIdx.x ^ 1)];
}}
'''


LDST_TEST = '''
extern "C" __global__ void __launch_bounds__(128) k(const uint4* __restrict__ in, uint4* __restrict__ out, unsigned add) {
  __shared__ alignas(16) uint4 a[128], b[128];
  const int t = threadIdx.x;
  a[t] = in[blockIdx.x * 128 + t];
  __syncthreads();
  uint32_t v[4];
#if USE_CUTE
  cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(&a[t ^ 8]), v[0], v[1], v[2], v[3]);
#else
  probe_ldsm_x4_trans(probe_smem_u32(&a[t ^ 8]), v);
#endif
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] += add;
#if USE_CUTE
  cute::SM90_U32x4_STSM_N::copy(v[0], v[1], v[2], v[3], *reinterpret_cast<cute::uint128_t*>(&b[t]));
#else
  probe_stsm_x4(probe_smem_u32(&b[t]), v);
#endif
  __syncthreads();
  out[blockIdx.x * 128 + t] = b[t ^ 1];
}
'''

GM = "cute::SM90::GMMA"
KM = f"{GM}::Major::K"
TESTS = [  # (label, the sm90_ptx group it stands for or None, body, SASS opcodes to show where they differ)
    ("wgmma SS m64n128k8 tf32 (fa wgh_tf32)", "wgmma",
     wgmma_test("wgh_tf32", f"{GM}::MMA_64x128x8_F32TF32TF32_SS_TN<>", 64), ["HGMMA"]),
    ("wgmma SS m64n128k16 bf16 (fa wgh_bf16)", "wgmma",
     wgmma_test("wgh_bf16", f"{GM}::MMA_64x128x16_F32BF16BF16_SS<{KM}, {KM}>", 64), ["HGMMA"]),
    ("wgmma SS m64n128k16 f16 (fa wgh_f16)", "wgmma",
     wgmma_test("wgh_f16", f"{GM}::MMA_64x128x16_F32F16F16_SS<{KM}, {KM}>", 64), ["HGMMA"]),
    ("wgmma SS m64n64k8 tf32 (fa R2 wgh_tf32_n64)", "wgmma",
     wgmma_test("wgh_tf32_n64", f"{GM}::MMA_64x64x8_F32TF32TF32_SS_TN<>", 32), ["HGMMA"]),
    ("wgmma SS m64n96k8 tf32 (fb_wgmma_tf32)", "wgmma",
     wgmma_test("fb_wgmma_tf32", f"{GM}::MMA_64x96x8_F32TF32TF32_SS_TN<>", 48), ["HGMMA"]),
    ("wgmma SS m64n96k16 bf16 (fb_wgmma_bf16)", "wgmma",
     wgmma_test("fb_wgmma_bf16", f"{GM}::MMA_64x96x16_F32BF16BF16_SS<{KM}, {KM}>", 48), ["HGMMA"]),
    ("wgmma fence / commit_group / wait_group 1,0 (cute warpgroup_*)", "sync", SYNC_TEST,
     ["WARPGROUP", "WARPSYNC", "HGMMA"]),
    ("mbarrier.init (cutlass ClusterBarrier::init)", "mbar_init", tma_test({"init": "cutlass"}), ["SYNCS"]),
    ("mbarrier.arrive.expect_tx (cutlass ClusterTransactionBarrier)", "mbar_tx", tma_test({"tx": "cutlass"}),
     ["SYNCS"]),
    ("mbarrier.try_wait.parity loop (cutlass ClusterBarrier::wait)", "mbar_wait", tma_test({"wait": "cutlass"}),
     ["SYNCS", "NANOSLEEP"]),
    ("  same, cute::initialize_barrier", None, tma_test({"init": "cute"}), ["SYNCS"]),
    ("  same, cute::set_barrier_transaction_bytes", None, tma_test({"tx": "cute"}), ["SYNCS"]),
    ("  same, cute::wait_barrier", None, tma_test({"wait": "cute"}), ["SYNCS", "NANOSLEEP"]),
    ("TMA cp.async.bulk.tensor.4d (cute SM90_TMA_LOAD_4D)", "tma", tma_test({"tma4": "cute"}), ["UTMALDG"]),
    ("TMA cp.async.bulk.tensor.5d (cute SM90_TMA_LOAD_5D)", "tma", tma_test({"tma5": "cute"}, 5), ["UTMALDG"]),
    ("cp.async.cg 16 B zfill (cute ..._CACHEGLOBAL_ZFILL)", "cp", cp_test("cg16"), ["LDGSTS"]),
    ("cp.async.ca 4 B zfill (cute ..._CACHEALWAYS_ZFILL)", "cp", cp_test("ca4"), ["LDGSTS"]),
    ("  cp.async.ca 16 B zfill (not used by fullfuse)", None, cp_test("ca16"), ["LDGSTS"]),
    ("cp.async commit / wait_group 1 / wait 0 (cute cp_async_*)", "cpwait", cp_test("sync"), ["DEPBAR"]),
    ("ldmatrix.x4.trans + stmatrix.x4 (cute SM75 LDSM_T / SM90 STSM_N)", "ldst", LDST_TEST, ["LDSM", "STSM"]),
]


# -------------------------------------------------------------------------------- the real family-A unit, CuTe-backed
LDSM_FF = re.compile(r'asm volatile\("ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16 \{%0,%1,%2,%3\}, \[%4\];"\s*'
                     r':\s*"=r"\(v\[0\]\), "=r"\(v\[1\]\), "=r"\(v\[2\]\), "=r"\(v\[3\]\) : "r"\(src\)\);')
STSM_FF = re.compile(r'asm volatile\("stmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16 \[%0\], \{%1,%2,%3,%4\};"\s*'
                     r'::\s*"r"\(dst\), "r"\(v\[0\]\), "r"\(v\[1\]\), "r"\(v\[2\]\), "r"\(v\[3\]\) : "memory"\);')
LDSM_CUTE = ("cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(FA_GEN(src)), "
             "v[0], v[1], v[2], v[3]);")
STSM_CUTE = "cute::SM90_U32x4_STSM_N::copy(v[0], v[1], v[2], v[3], *reinterpret_cast<cute::uint128_t*>(FA_GEN(dst)));"
SM90_GROUPS = ["wgmma", "sync", "cpwait", "cp", "mbar_init", "mbar_wait", "mbar_tx", "tma"]

REAL_UNITS = [  # (kernel, what it exercises)
    ("fa_wgmma_kernel<0, false, 6, 10, 3, false>", "tf32, TNCHW: TMA 4d + mbarrier"),
    ("fa_wgmma_kernel<0, false, 5, 10, 3, false>", "tf32, TVEC: TMA 5d + mbarrier"),
    ("fa_wgmma_kernel<1, false, 6, 0, 3, false>", "bf16, TNCHW: ldmatrix/stmatrix, general chain"),
    ("fa_wgmma_kernel<0, false, 0, 10, 3, false>", "tf32, VEC: cp.async 16 B"),
]
REAL_TIMED = REAL_UNITS[0][0]


def prepare_csrc(dst: Path, uintptr_fix: bool):
    """A copy of csrc converted for NVRTC (if not yet), device_std.h's uintptr_t as libcu++ spells it if asked."""
    shutil.copytree(REPO / "csrc", dst)
    pat = re.compile(r"#include <(stdint\.h|type_traits|cuda\.h|cuda_runtime\.h)>")
    converted = 0
    for f in list(dst.rglob("*.cuh")) + list(dst.rglob("*.h")):
        if f.name == "device_std.h":
            continue
        t = f.read_text()
        t2 = pat.sub('#include "device_std.h"', t)
        if t2 != t:
            converted += 1
            f.write_text(t2)
    ds = dst / "device_std.h"
    if uintptr_fix and ds.is_file():
        ds.write_text(ds.read_text().replace("typedef unsigned long uintptr_t;", "typedef unsigned long long uintptr_t;"))
    return converted


def make_cute_backed(src_dir: Path, dst: Path, cute_groups):
    """A copy of csrc whose sm90_ptx.cuh takes the groups in cute_groups from CuTe / CUTLASS (the rest: fullfuse's own
    text), and whose ldmatrix / stmatrix go through CuTe if 'ldst' is among them.  Returns (ldmatrix, stmatrix) call
    sites replaced and the headers the unit includes."""
    shutil.copytree(src_dir, dst)
    hdrs = sorted({h for g in cute_groups for h in GROUP_HEADERS[g]})
    text = ("// probe: sm90_ptx.cuh with " + (", ".join(sorted(cute_groups)) or "nothing") + " through CuTe / CUTLASS\n"
            "#pragma once\n#include \"device_std.h\"\n" + "".join(f"#include <{h}>\n" for h in hdrs)
            + "#define FA_GEN(a) reinterpret_cast<void*>(__cvta_shared_to_generic(a))\n" + FF_G["head"])
    for g in SM90_GROUPS:
        text += (CUTE_G if g in cute_groups else FF_G)[g]
    (dst / "fused_conv_act_pool" / "sm90_ptx.cuh").write_text(text)
    n1 = n2 = 0
    if "ldst" in cute_groups:
        rl = dst / "fused_conv_act_pool" / "ring_loaders.cuh"
        t = rl.read_text()
        t, n1 = LDSM_FF.subn(LDSM_CUTE, t)
        t, n2 = STSM_FF.subn(STSM_CUTE, t)
        rl.write_text(t)
    return n1, n2, hdrs


# ---------------------------------------------------------------------------------------------------------- main
def table(rows, header):
    w = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w[i]) for i, c in enumerate(r)) + " |"
    print(line(header))
    print("|" + "|".join("-" * (x + 2) for x in w) + "|")
    for r in rows:
        print(line(r))
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cccl", help="include dir holding cccl/ (nvidia-cuda-cccl wheel's nvidia/cu13/include)")
    ap.add_argument("--nvdisasm")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-real", action="store_true", help="skip the real family-A units")
    ap.add_argument("--keep", help="folder to keep the cubins and SASS listings in")
    args = ap.parse_args()

    cud, cut = cuda_include(), cutlass_include()
    cccl = find_cccl(args.cccl)
    nvdisasm = find_tool("nvdisasm", args.nvdisasm)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="cutlass_nvrtc_probe_"))
    tmp.mkdir(parents=True, exist_ok=True)
    ver = open(Path(cut) / "cutlass" / "version.h").read()
    cv = ".".join(re.search(rf"#define CUTLASS_{k} (\d+)", ver).group(1) for k in ("MAJOR", "MINOR", "PATCH"))
    print(f"NVRTC {nvrtc_version()}, arch {ARCH}; CUTLASS {cv} headers: {cut}")
    print(f"CUDA headers: {cud}\nCCCL (libcu++) include dir: {cccl or 'NOT FOUND (pip install nvidia-cuda-cccl)'}")
    print(f"nvdisasm: {nvdisasm or 'NOT FOUND (pip install nvidia-cuda-nvdisasm)'}; cpu count {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.2f}\n")
    base_inc = [cut, cud]
    cc_inc = [cccl, cccl + "/cccl"] if cccl else []
    ds_src = (REPO / "csrc" / "device_std.h").read_text() if (REPO / "csrc" / "device_std.h").is_file() else None
    shim = Path(tmp) / "shim"
    shim.mkdir(exist_ok=True)
    if ds_src is not None:
        (shim / "device_std.h").write_text(ds_src)
        (shim / "device_std_fixed.h").write_text(
            ds_src.replace("typedef unsigned long uintptr_t;", "typedef unsigned long long uintptr_t;"))

    compile_unit('extern "C" __global__ void warm(int* p) { *p = 1; }', [cud])  # NVRTC's one-time load, untimed

    # ---- 1. does each header compile, and with what
    print("## 1. Header compiles under NVRTC (trivial kernel + the include)\n")
    trivial = '\nextern "C" __global__ void k(int* p) { *p = 1; }\n'
    configs = [("CUTLASS + CUDA headers only", base_inc, "", False)]
    if tuple(map(int, nvrtc_version().split("."))) >= (13, 1):
        configs.append(("+ NVRTC bundled headers (use_bundled_headers)", [cut], "", True))
    if cccl:
        configs += [("+ CCCL <dir> only", base_inc + [cccl], "", False),
                    ("+ CCCL <dir>/cccl only", base_inc + [cccl + "/cccl"], "", False),
                    ("+ CCCL <dir> and <dir>/cccl", base_inc + cc_inc, "", False)]
        if ds_src is not None:
            configs += [("+ CCCL, project device_std.h first", base_inc + cc_inc + [str(shim)],
                         '#include "device_std.h"\n', False),
                        ("+ CCCL, device_std.h with uintptr_t = unsigned long long", base_inc + cc_inc + [str(shim)],
                         '#include "device_std_fixed.h"\n', False)]
    rows = []
    for name, inc, pre, bundled in configs:
        for h in HEADERS + [ALL]:
            inc_line = CUTE_INCLUDES if h == ALL else f"#include <{h}>\n"
            src = pre + inc_line + trivial
            ok, out, w, c = compile_unit(src, inc, bundled=bundled)
            rows.append((name, h, "yes" if ok else "NO", f"{w:.2f}", "" if ok else first_errors(out)))
    table(rows, ("include set", "header", "compiles", "wall s", "first error lines (verbatim)"))
    if not cccl:
        print("No CCCL include dir: nothing further can use the CUTLASS headers. Stop.")
        return
    good_inc = base_inc + cc_inc

    # ---- 2. compile-time cost, small unit
    print(f"## 2. Extra compile time, small unit (median of {args.reps}; wall s and this process's CPU s)\n")
    small = (FF_WRAPPERS + tma_test({"init": "cutlass", "tx": "cutlass", "wait": "cutlass", "tma4": "cute"})
             + TESTS[0][2].replace(" k(", " k2(") + SYNC_TEST.replace(" k(", " k3(")
             + cp_test("cg16").replace(" k(", " k4(") + LDST_TEST.replace(" k(", " k5(") + "\n")
    pre = '#include "device_std_fixed.h"\n'
    inc2 = good_inc + [str(shim)]
    labels = ["small unit (5 kernels: wgmma tf32, wgmma sync, TMA 4d + mbarrier, cp.async, ldmatrix/stmatrix), "
              "fullfuse wrappers, no CUTLASS include"]
    builds = [(pre + "#define USE_CUTE 0\n" + small, inc2, ())]
    for h in HEADERS + [ALL]:
        inc_line = CUTE_INCLUDES if h == ALL else f"#include <{h}>\n"
        labels.append(f"  + #include <{h}>" if h != ALL else "  + all five includes")
        builds.append((pre + "#define USE_CUTE 0\n" + inc_line + small, inc2, ()))
    labels.append("  + all five, every call through CUTLASS/CuTe")
    builds.append((pre + "#define USE_CUTE 1\n" + CUTE_INCLUDES + small, inc2, ()))
    results = timed(builds, args.reps)
    if isinstance(results[0], str):
        print("small unit failed:", first_errors(results[0], 4))
        return
    table(timing_rows(labels, results, results[0]), TIME_HEADER)

    if not nvdisasm:
        print("No nvdisasm: skipping the SASS comparison.")
        return

    # ---- 3. SASS equivalence, tiny kernels
    print("## 3. SASS: fullfuse wrapper vs CuTe / CUTLASS wrapper (same kernel otherwise)\n")
    rows, details, group_ok = [], [], {}
    prelude = '#include "device_std_fixed.h"\n' + CUTE_INCLUDES + FF_WRAPPERS
    for label, group, body, pats in TESTS:
        res = {}
        for use in (0, 1):
            ok, out, _, _ = compile_unit(prelude + f"#define USE_CUTE {use}\n" + body, inc2)
            res[use] = sass(out, nvdisasm, tmp) if ok else None
            if not ok:
                details.append(f"{label} [{'cute' if use else 'ff'}] compile error: {first_errors(out, 3)}")
        if res[0] is None or res[1] is None:
            rows.append((label, "compile error", "-"))
            if group:
                group_ok[group] = False
            continue
        verdict, det = compare(res[0], res[1])
        rows.append((label, verdict, det))
        if group:
            group_ok[group] = group_ok.get(group, True) and verdict == "identical"
        ka, kb = key_lines(res[0], pats), key_lines(res[1], pats)
        if verdict != "identical":
            details.append(f"{label.strip()}:\n      ff  : " + "\n            ".join(ka)
                           + "\n      cute: " + "\n            ".join(kb))
        if args.keep:
            for use in (0, 1):
                (tmp / f"{re.sub(r'[^a-z0-9]+', '_', label.strip().lower())}_{'cute' if use else 'ff'}.sass"
                 ).write_text("\n".join(res[use]))
    table(rows, ("wrapper", "SASS", "differences (opcode.modifiers; '@P' = guarded)"))
    if details:
        print("Key instructions where they differ (full SASS text, in program order):")
        for d in details:
            print("  " + d)
        print()
    same = [g for g in SM90_GROUPS + ["ldst"] if group_ok.get(g)]
    print(f"Groups whose every test gave identical SASS: {', '.join(same) or 'none'}; different: "
          f"{', '.join(g for g in SM90_GROUPS + ['ldst'] if g in group_ok and not group_ok[g]) or 'none'}\n")
    if args.no_real:
        return

    # ---- 4. the real family-A units
    print("## 4. Real family-A units (csrc copy): compile time and SASS\n")
    plain, fixed = Path(tmp) / "csrc_plain", Path(tmp) / "csrc_fixed"
    allc, adopt, wgo = Path(tmp) / "csrc_cute_all", Path(tmp) / "csrc_cute_same", Path(tmp) / "csrc_cute_wgmma"
    for d in (plain, fixed, allc, adopt, wgo):
        shutil.rmtree(d, ignore_errors=True)
    nconv = prepare_csrc(plain, False)
    prepare_csrc(fixed, True)
    a1, a2, ahdr = make_cute_backed(fixed, allc, SM90_GROUPS + ["ldst"])
    s1, s2, shdr = make_cute_backed(fixed, adopt, same)
    make_cute_backed(fixed, wgo, [g for g in ("wgmma", "sync") if g in same])
    print(f"csrc copied to {tmp}: {nconv} headers converted to device_std.h; 'all': every sm90_ptx.cuh group + "
          f"ldmatrix ({a1}) / stmatrix ({a2}) through CuTe/CUTLASS; 'same': only {', '.join(same) or 'nothing'} "
          f"(includes {', '.join(shdr) or 'none'}; ldmatrix {s1} / stmatrix {s2})\n")
    hdr = '#include "fused_conv_act_pool/wgmma_kernel.cuh"\n'
    incl = '#include "device_std.h"\n' + CUTE_INCLUDES + hdr
    names = (REAL_TIMED,)
    builds = [  # (label, source, include dirs)
        ("tree as is (no CCCL on the path)", hdr, [str(plain)] + base_inc),
        ("tree, uintptr_t fix, CCCL on the path", hdr, [str(fixed)] + good_inc),
        ("+ all five CUTLASS includes, device_std.h as in the tree", incl, [str(plain)] + good_inc),
        ("+ all five CUTLASS includes (uintptr_t fix)", incl, [str(fixed)] + good_inc),
        ("every wrapper through CuTe/CUTLASS ('all')", hdr, [str(allc)] + good_inc),
        ("only the identical-SASS groups through CuTe ('same')", hdr, [str(adopt)] + good_inc),
        ("only wgmma + fence/commit/wait through CuTe ('wgmma')", hdr, [str(wgo)] + good_inc),
    ]
    results = timed([(src, inc, names) for _, src, inc in builds], args.reps)
    print(f"Compile of {REAL_TIMED} (median / min of {args.reps}, interleaved; extra against the second row):\n")
    table(timing_rows([b[0] for b in builds], results, results[1]), TIME_HEADER)

    rows = []
    for kname, what in REAL_UNITS:
        cubins = {}
        for tag, src, inc in (("tree", hdr, [str(fixed)] + good_inc), ("incl", incl, [str(fixed)] + good_inc),
                              ("all", hdr, [str(allc)] + good_inc), ("same", hdr, [str(adopt)] + good_inc),
                              ("wgmma", hdr, [str(wgo)] + good_inc)):
            ok, out, _, _ = compile_unit(src, inc, (kname,))
            cubins[tag] = sass(out, nvdisasm, tmp) if ok else first_errors(out)
            if args.keep and ok:
                (tmp / f"real_{re.sub(r'[^a-z0-9]+', '_', kname)}_{tag}.sass").write_text("\n".join(cubins[tag]))
        ref = cubins["tree"]
        cells = []
        for tag in ("incl", "all", "same", "wgmma"):
            if isinstance(cubins[tag], str) or isinstance(ref, str):
                cells.append("compile error: " + (cubins[tag] if isinstance(cubins[tag], str) else ref))
            else:
                v, d = compare(ref, cubins[tag])
                cells.append(v if v == "identical" else f"{v}: {d}")
        n = len(ref) if not isinstance(ref, str) else "?"
        rows.append((kname, what, n, *cells))
    table(rows, ("kernel", "exercises", "instr.", "includes only", "'all' through CuTe", "'same' through CuTe",
                 "'wgmma' through CuTe"))


if __name__ == "__main__":
    main()
