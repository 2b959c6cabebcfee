#!/usr/bin/python3
"""Runs the cases of tests/gguf_py_vectors.txt: writes each file with scripts/gguf_py_gen.py
(llama.cpp's gguf-py), runs `shoal generate --prompt P --max-tokens 8 --temperature 0
--top-logprobs 5` on it and compares with what llama.cpp computed on the same bytes. F32: the 8
greedy ids, each step's top-5 ids, |delta logprob| <= 0.03; quantized: the first id (issue 29's
acceptance). Prints one "ok ..." or "FAIL ..." line per case.

usage: gguf_py_check.py SHOAL GEN VECTORS TMPDIR (GGUF_PY in the environment)"""
import json
import subprocess
import sys


def cases(path):
    out, cur = [], None
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        key, _, rest = line.partition(" ")
        if key == "case":
            cur = {"spec": rest.split(), "steps": []}
            out.append(cur)
        elif key == "prompt":
            # \n and \t written as escapes, as printf %b reads them
            cur["prompt"] = rest.replace("\\n", "\n").replace("\\t", "\t")
        elif key == "ids":
            cur["ids"] = [int(x) for x in rest.split()]
        elif key == "step":
            f = rest.split()
            cur["steps"].append((int(f[0]), [(int(a), float(b)) for a, b in (x.split(":") for x in f[1:])]))
    return out


def main():
    shoal, gen, vec, tmp = sys.argv[1:5]
    bad = 0
    for n, c in enumerate(cases(vec)):
        fam, typ, flags = c["spec"][0], c["spec"][1], c["spec"][2:]
        name = " ".join(c["spec"]) + (" (chat prompt)" if "<" in c["prompt"] else "")
        path = f"{tmp}/case{n}.gguf"
        r = subprocess.run(["/usr/bin/python3", gen, "--family", fam, "--type", typ, *flags, "-o", path],
                           capture_output=True, text=True)
        if r.returncode:
            print(f"FAIL {name}: generator: {r.stderr.strip()[-300:]}")
            bad += 1
            continue
        r = subprocess.run([shoal, "generate", "--model", path, "--prompt", c["prompt"], "--max-tokens", "8",
                            "--temperature", "0", "--top-logprobs", "5", "--threads", "2"],
                           capture_output=True, text=True)
        got = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
        if r.returncode or not got:
            print(f"FAIL {name}: shoal generate exit {r.returncode}: {r.stderr.strip()[-300:]}")
            bad += 1
            continue
        want = c["steps"]
        why = []
        if typ == "f32":
            if [g["id"] for g in got] != [w[0] for w in want]:
                why.append(f"ids {[g['id'] for g in got]} != llama.cpp {[w[0] for w in want]}")
            md = 0.0
            for i, (g, w) in enumerate(zip(got, want)):
                gt = [(t["id"], t["logprob"]) for t in g["top"]]
                if [a for a, _ in gt] != [a for a, _ in w[1]]:
                    why.append(f"step {i} top-5 {[a for a, _ in gt]} != {[a for a, _ in w[1]]}")
                md = max([md] + [abs(x - y) for (_, x), (_, y) in zip(gt, w[1])])
            if md > 0.03:
                why.append(f"|delta logprob| {md:.4f} > 0.03")
            detail = f"max |delta logprob| {md:.4f}"
        else:
            if got[0]["id"] != want[0][0]:
                why.append(f"first id {got[0]['id']} != llama.cpp {want[0][0]}")
            detail = f"first id {got[0]['id']}"
        if why:
            print(f"FAIL {name}: " + "; ".join(why))
            bad += 1
        else:
            print(f"ok {name}: {detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
