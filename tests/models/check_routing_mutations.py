#!/usr/bin/env python3
"""Breaks each MoE routing branch once and checks that test_reference catches it.

Not a CTest test (it edits sources and rebuilds): run it by hand after a full
build, with the test models made (ctest -R make_test_models):

    tests/models/check_routing_mutations.py [--build build] [--models DIR] [--golden DIR]

For each mutation it edits one line, rebuilds test_reference, runs it, restores
the file, and reports which golden models failed. A mutation that no golden
model notices means a routing branch without a test. The sources are restored
and test_reference rebuilt at the end, also on Ctrl-C."""
import argparse, os, re, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MOE = "src/tp/models/moe_config.cpp"
DS = "src/tp/models/deepseek_config.cpp"
DSH = "src/tp/models/deepseek_config.h"
OPS = "src/tp/ops/moe_experts.cpp"
# (what is broken, file, text, replacement, the golden models that must notice)
MUTATIONS = [
    ("Qwen3-MoE renormalises although norm_topk_prob is false", MOE,
     'c.raw_bool("norm_topk_prob", false)', "true", {"qwen3_moe-route"}),
    ("Qwen3-MoE never renormalises (norm_topk_prob true ignored)", MOE,
     'c.raw_bool("norm_topk_prob", false)', "false", {"qwen3_moe-route-norm"}),
    ("Mixtral does not renormalise", MOE, "m.norm_topk_prob = mixtral ||", "m.norm_topk_prob =", {"mixtral-route"}),
    # (A softmax over all experts, then the top-k renormalised, is the softmax over the k: no mutation.)
    ("GPT-OSS weighs its top-k by the softmax over all experts, not over the k", MOE,
     ".renormalize = m.norm_topk_prob, .top_k_then_softmax = m.gpt_oss",
     ".renormalize = !m.gpt_oss && m.norm_topk_prob, .top_k_then_softmax = false", {"gpt_oss-route"}),
    ("decoder_sparse_step ignored", MOE, "(layer + 1) % decoder_sparse_step == 0", "true", {"qwen3_moe-route"}),
    ("mlp_only_layers ignored", MOE, "mlp_only_layers.end()) return false;", "mlp_only_layers.end()) {}",
     {"qwen3_moe"}),
    ("DeepSeek-V2 group-limited routing read as greedy", DS, 'if (method != "greedy") {', "if (false) {",
     {"deepseek_v2-route"}),
    ("DeepSeek-V2 renormalises when norm_topk_prob (Transformers ignores it)", DS,
     'm.norm_topk_prob = s.v3 && c.raw_bool("norm_topk_prob", true)',
     'm.norm_topk_prob = c.raw_bool("norm_topk_prob", true)', {"deepseek_v2-route"}),
    ("DeepSeek-V3 renormalises although norm_topk_prob is false", DS,
     'm.norm_topk_prob = s.v3 && c.raw_bool("norm_topk_prob", true)', "m.norm_topk_prob = s.v3",
     {"deepseek_v3-route-nonorm"}),
    ("DeepSeek-V3 scores with a softmax instead of a sigmoid", DS, "r.sigmoid = s.v3;", "r.sigmoid = false;",
     {"deepseek_v3", "deepseek_v3-route"}),
    ("DeepSeek-V3 scores a group by its best expert, not its best two", DS, "r.group_sum_top2 = s.v3;",
     "r.group_sum_top2 = false;", {"deepseek_v3-route"}),
    ("routed_scaling_factor ignored", DS, "r.scaling = it->get<double>();", "(void)it;",
     {"deepseek_v2-route", "deepseek_v3-route"}),
    ("first_k_dense_replace ignored", DSH, "n_routed_experts > 0 && i >= first_k_dense_replace",
     "n_routed_experts > 0", {"deepseek_v2"}),
    ("the correction bias does not steer the choice", OPS, "choice[e] += bs[e];", "(void)bs[e];",
     {"deepseek_v3-route"}),
    ("experts of groups not kept stay eligible", OPS, "taken[e] = !kept[e / per_group];", "taken[e] = false;",
     {"deepseek_v2-route", "deepseek_v3-route"}),
]


def run(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, **kw)


def rebuild(build):
    r = run(["cmake", "--build", build, "--target", "test_reference", "-j", str(os.cpu_count())])
    if r.returncode != 0:
        sys.exit(f"build failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")


def failing_models(build, env):
    r = run([os.path.join(build, "tests/models/test_reference")], env=env)
    return set(re.findall(r"\[  FAILED  \] Tiny/Reference\.Tp1MatchesPyTorch/\d+, where GetParam\(\) = \"([^\"]+)\"",
                          r.stdout))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--models", default=None, help="the test models (default: BUILD/tests/models/models)")
    ap.add_argument("--golden", default=os.path.join(ROOT, "tests/reference/golden"))
    a = ap.parse_args()
    env = dict(os.environ, TP_TEST_MODELS=a.models or os.path.join(a.build, "tests/models/models"),
               TP_GOLDEN_DIR=a.golden, OMP_NUM_THREADS="1")
    rebuild(a.build)
    base = failing_models(a.build, env)
    if base:
        sys.exit(f"test_reference fails before any mutation: {sorted(base)}")
    missed = 0
    try:
        for what, path, old, new, want in MUTATIONS:
            full = os.path.join(ROOT, path)
            text = open(full).read()
            if text.count(old) != 1:
                sys.exit(f"{path}: expected '{old}' once, found it {text.count(old)} times")
            open(full, "w").write(text.replace(old, new))
            try:
                rebuild(a.build)
                got = failing_models(a.build, env)
            finally:
                open(full, "w").write(text)
            ok = want <= got
            missed += not ok
            print(f"{'caught' if ok else 'MISSED'}: {what}: failing {sorted(got) or 'none'}"
                  f"{'' if ok else f' (expected {sorted(want)})'}", flush=True)
    finally:
        rebuild(a.build)
    print(f"{len(MUTATIONS) - missed} of {len(MUTATIONS)} mutations caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
