#!/usr/bin/python3
"""The layer rules of src/tp, checked on the sources (a CTest test).

  check_layers.py SRC_TP_DIR
  check_layers.py --self-test   # each rule, broken once in a small tree, is reported

1. Layers depend only downward. LAYERS below is the one place the order is
   written: a file in src/tp/<layer>/ may include "tp/<other>/..." only when
   <other> is the same layer or one listed before it. tprun's launcher
   (cli/tprun/) is a library of its own: it includes nothing but core/, and
   nothing else includes it.
2. Raw element loops belong to ops/ (and io/, tokenizer/, chat/, which parse
   bytes and text, and tensor/, which defines the accessors): elsewhere a file
   that reaches a tensor's elements through data<T>() is a kernel outside the
   kernel seam (ops/dispatch.h), which a second device could not run: write the
   kernel in ops/ behind its family's table and call the op.
3. oneDNN stays behind ops/: only ops/ sources and the headers in ops/detail/
   include it, and only ops/ includes ops/detail/, so that ops' public headers
   name no CPU library (a second device adds its own detail/).

Exits 1 naming every file and line that breaks a rule.
"""
import os
import re
import sys

LAYERS = ["core", "tensor", "autograd", "ops", "distributed", "nn", "parallel", "io", "models", "tokenizer", "chat",
          "generation", "training", "serving", "cli"]
LAUNCHER = "cli/tprun"
RAW_ELEMENT_LAYERS = {"ops", "io", "tokenizer", "chat", "tensor", "core"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"tp/([a-z_]+)/([^"]+)"')
# oneDNN (and any other CPU kernel library) stays behind ops/: only ops/ sources
# and ops/detail/ headers include it, and only ops/ includes ops/detail/.
DNNL_INCLUDE = re.compile(r"^\s*#\s*include\s+<(?:oneapi/dnnl/)?dnnl")
OPS_DETAIL = "ops/detail/"
RAW_ELEMENT = re.compile(r"\bdata<")


def layer_of(rel):
    return rel.split("/")[0]


def check(root):
    problems = []
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith((".h", ".cpp")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            layer = layer_of(rel)
            if layer not in LAYERS:
                problems.append(f"{rel}: folder '{layer}' is not in LAYERS of {__file__}; add it where it belongs")
                continue
            in_launcher = rel.startswith(LAUNCHER + "/")
            raw_uses = 0
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if m:
                        target = m.group(1)
                        target_path = f"{target}/{m.group(2)}"
                        if in_launcher and target != "core" and not target_path.startswith(LAUNCHER + "/"):
                            problems.append(f"{rel}:{number}: the launcher includes tp/{target_path}; it may "
                                            "include only tp/core/ (it links no libtp)")
                        elif not in_launcher and target_path.startswith(LAUNCHER + "/"):
                            problems.append(f"{rel}:{number}: includes the launcher (tp/{target_path}); only tprun "
                                            "uses it")
                        elif target not in LAYERS:
                            problems.append(f"{rel}:{number}: includes tp/{target_path} of unknown layer '{target}'")
                        elif LAYERS.index(target) > LAYERS.index(layer):
                            problems.append(f"{rel}:{number}: {layer}/ includes tp/{target_path}, a higher layer "
                                            f"(order: {' < '.join(LAYERS)})")
                        elif target_path.startswith(OPS_DETAIL) and layer != "ops":
                            problems.append(f"{rel}:{number}: includes tp/{target_path}, internal to ops/ (call the "
                                            "op through its public header)")
                    if DNNL_INCLUDE.match(line) and not (rel.startswith(OPS_DETAIL) or
                                                         (layer == "ops" and rel.endswith(".cpp"))):
                        problems.append(f"{rel}:{number}: includes oneDNN; only ops/ sources and ops/detail/ headers "
                                        "may (the device seam: ops' public headers name no CPU library)")
                    code = line.split("//", 1)[0]
                    raw_uses += len(RAW_ELEMENT.findall(code))
            if raw_uses and layer not in RAW_ELEMENT_LAYERS:
                problems.append(f"{rel}: {raw_uses} data<T>() uses: element loops belong in ops/ (write the kernel "
                                "there, behind its family's kernel table, and call the op)")
    return problems


def self_test():
    import tempfile
    cases = {  # file -> (its text, what the report must say)
        "ops/kernel.cpp": ('#include "tp/training/trainer.h"\n', "ops/ includes tp/training/trainer.h, a higher layer"),
        "models/arch.cpp": ("float f(Tensor t) { return t.data<float>()[0]; }\n", "models/arch.cpp: 1 data<T>() uses"),
        "training/loss.cpp": ("// data<float>() in a comment does not count\n", None),
        "io/json.cpp": ("char c = t.data<char>()[0];\n", None),
        "cli/tprun/launch.cpp": ('#include "tp/models/auto.h"\n', "the launcher includes tp/models/auto.h"),
        "serving/engine.cpp": ('#include "tp/cli/tprun/launch.h"\n', "includes the launcher"),
        "widgets/w.h": ("\n", "folder 'widgets' is not in LAYERS"),
        "ops/linear.h": ("#include <dnnl.hpp>\n", "ops/linear.h:1: includes oneDNN"),
        "nn/fused.cpp": ('#include "tp/ops/detail/dnnl_context.h"\n', "internal to ops/"),
        "ops/detail/ctx.h": ("#include <oneapi/dnnl/dnnl.hpp>\n", None),
        "nn/module.h": ('#include "tp/nn/parallel_layer.h"\n#include "tp/core/error.h"\n', None),
    }
    with tempfile.TemporaryDirectory() as root:
        for rel, (text, _) in cases.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        report = "\n".join(check(root))
    expected = [want for _, want in cases.values() if want]
    missing = [want for want in expected if want not in report]
    if missing or report.count("\n") + 1 != len(expected):
        sys.exit(f"self-test failed; missing {missing} in the report:\n{report}")
    print(f"self-test ok: {len(expected)} broken rules reported, the clean file not")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    problems = check(sys.argv[1])
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layer rule(s) broken")
        sys.exit(1)
    print(f"layers ok: {' < '.join(LAYERS)}; element loops only in {', '.join(sorted(RAW_ELEMENT_LAYERS))}")


if __name__ == "__main__":
    main()
