"""Compare the SASS of two builds of a kernel library function by function (cuobjdump -sass; instruction text with
the encodings and addresses dropped): how many are identical, which differ, which are new.  Kernel names of the newer
build may carry trailing template arguments that the older did not have, all false (`bool` defaults added later):
--strip N drops N trailing `Lb0E` of fa_wgmma_kernel names before matching.

    python3 benchmarks/sass_compare.py OLD.so NEW.so [--strip 1]      (cuobjdump on PATH: pip nvidia-cuda-cuobjdump)
"""
import argparse
import collections
import re
import subprocess


def functions(path, strip=0):
    out = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
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
            name = f.group(1)
            for _ in range(strip):
                if "fa_wgmma_kernel" in name and name.endswith("ELb0EEv8WGParams"):
                    name = name[: -len("ELb0EEv8WGParams")] + "EEv8WGParams"
            key, body = (arch, name), []
        elif key:
            ins = re.sub(r"/\*.*?\*/", "", line).strip()
            if ins and not ins.startswith("."):
                body.append(re.sub(r"\s+", " ", ins))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--strip", type=int, default=0)
    args = ap.parse_args()
    a, b = functions(args.old), functions(args.new, args.strip)
    count = collections.Counter()
    for k in a:
        state = "only in old" if k not in b else "identical" if a[k] == b[k] else "differ"
        count[state] += 1
        if state != "identical":
            print(state, *k)
    count["only in new"] = sum(k not in a for k in b)
    print(dict(count))


if __name__ == "__main__":
    main()
