"""Compare the SASS of two builds of the kernels function by function (cuobjdump -sass; instruction text with the
encodings, addresses and constant-bank parameter offsets dropped): which are identical, which differ and how (counts
of instructions and of differing lines, and the opcodes whose counts changed), which exist in only one build.

    python3 benchmarks/sass_compare.py OLD NEW [--arch sm_90a] [--show 3]

OLD / NEW: a shared library or cubin, or a folder whose *.cubin files are taken together (a fullfuse kernel cache's
``cubins/``).  Functions are matched by demangled name without namespaces, so an nvcc library build and NVRTC's
per-variant cubins of the same kernels line up.  Needs cuobjdump and c++filt on PATH (pip nvidia-cuda-cuobjdump).
"""
import argparse
import collections
import difflib
import re
import subprocess
from pathlib import Path


def _demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return [re.sub(r"\b[A-Za-z_]\w*::", "", n.replace("(anonymous namespace)::", "")).replace(" ", "")
            for n in out.splitlines()]


def _dump(path: Path):
    out = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    res, arch, key, body = {}, None, None, []
    for line in out.splitlines() + ["arch = end"]:
        m = re.match(r"\s*arch = (\S+)", line)
        f = re.match(r"\s*Function : (\S+)", line)
        if (m or f or line.startswith("Fatbin")) and key:
            res[key] = body
            key = None
        if m:
            arch = m.group(1)
        elif f:
            key, body = (arch, f.group(1)), []
        elif key:
            ins = re.sub(r"/\*.*?\*/", "", line).strip()
            if ins and not ins.startswith("."):
                ins = re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][PARAM]", ins)   # parameter offsets may move
                body.append(re.sub(r"\s+", " ", ins))
    return res


def functions(path: str, arch: str):
    p = Path(path)
    files = sorted(p.glob("*.cubin")) if p.is_dir() else [p]
    raw = {}
    for f in files:
        raw.update(_dump(f))
    raw = {k: v for k, v in raw.items() if arch in (k[0] or arch)}
    names = _demangle([k[1] for k in raw])
    return {name: body for name, body in zip(names, raw.values())}


def _opcodes(body):
    return collections.Counter(re.sub(r"^@!?U?P\w+ ", "", ins).split(" ")[0] for ins in body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--show", type=int, default=4, help="opcode count changes to print per differing function")
    args = ap.parse_args()
    a, b = functions(args.old, args.arch), functions(args.new, args.arch)
    count = collections.Counter()
    for name in sorted(set(a) & set(b)):
        if a[name] == b[name]:
            count["identical"] += 1
            continue
        count["differ"] += 1
        sm = difflib.SequenceMatcher(None, a[name], b[name], autojunk=False)
        changed = sum(max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in sm.get_opcodes() if op != "equal")
        oa, ob = _opcodes(a[name]), _opcodes(b[name])
        delta = sorted(((ob[o] - oa[o], o) for o in set(oa) | set(ob) if ob[o] != oa[o]), key=lambda t: -abs(t[0]))
        print(f"differ {name}: {len(a[name])} -> {len(b[name])} instructions, {changed} lines differ; opcodes "
              + ", ".join(f"{o} {d:+d}" for d, o in delta[:args.show]))
    for name in sorted(set(a) - set(b)):
        count["only in old"] += 1
        print("only in old", name)
    count["only in new"] = len(set(b) - set(a))
    print(dict(count))


if __name__ == "__main__":
    main()
