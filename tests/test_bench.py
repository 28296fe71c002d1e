"""`sjd-pac bench` / `sjd-pac lossless` end to end on a tiny grid, the prompt files, the method
grammar and the small statistics helpers. Never asserts on timings: speed is measured by the
benchmark command, not by a unit test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sjd_pac_core.bench import lossless as L
from sjd_pac_core.bench.methods import (DEFAULT_METHODS, LUMINA2_AUTHORS_SJD, MethodSpec, method_key, parse_method,
                                       parse_methods, parse_seeds)
from sjd_pac_core.bench.runner import PROMPT_DIR, load_prompts
from sjd_pac_core.cli import main
from sjd_pac_core.demo import captions
from sjd_pac_core.models.loader import DEMO_FOLDER


@pytest.fixture(scope="module")
def bench_model_folder(request) -> str:
    """The shipped demo weights when they are there, else the smoke-trained checkpoint."""
    if (DEMO_FOLDER / "model.safetensors").is_file():
        return "demo"
    return str(request.getfixturevalue("smoke_demo_folder"))


def _assert_png(path: Path) -> None:
    assert path.is_file(), path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.format == "PNG" and im.width >= 200 and im.height >= 100


def test_bench_end_to_end(bench_model_folder, tmp_path):
    out = tmp_path / "bench"
    rc = main(["bench", "--model", bench_model_folder, "--prompts", "2", "--methods", "ar,sjd-pac@16",
               "--out", str(out), "--quiet", "--locality-samples", "1", "--threads", "1", "--no-warmup"])
    assert rc == 0
    data = json.loads((out / "results.json").read_text())
    md = (out / "results.md").read_text()

    assert [m["key"] for m in data["methods"]] == ["ar", "sjd-pac@16"]
    assert data["environment"]["torch_threads"] == 1 and "threads 1" in md
    assert len(data["prompts"]) == 2 and data["seeds"] == [0]
    runs = data["runs"]
    assert len(runs) == 4  # 2 prompts x 1 seed x 2 methods
    for pair in {(r["prompt_index"], r["seed"]) for r in runs}:  # both methods ran on every pair
        assert sorted(r["method"] for r in runs if (r["prompt_index"], r["seed"]) == pair) == ["ar", "sjd-pac@16"]
    for r in runs:  # every field consistent with RunStats
        assert r["tokens"] == 272 == sum(r["accept_lengths"])
        assert r["forward_passes"] == len(r["accept_lengths"]) == len(r["windows"])
        assert math.isclose(r["step_compression"], r["tokens"] / r["forward_passes"])
        assert math.isclose(r["overhead_s"], r["sampler_s"] - r["forward_s"])
        assert 0 < r["forward_s"] <= r["sampler_s"] <= r["latency_s"]
        assert min(r["accept_lengths"]) >= 1
    ar_runs = [r for r in runs if r["method"] == "ar"]
    assert all(r["forward_passes"] == 272 and r["windows"] == [0] * 272 for r in ar_runs)

    summary = data["summary"]
    for key, row in summary.items():
        rs = [r for r in runs if r["method"] == key]
        assert row["runs"] == len(rs)
        assert math.isclose(row["step_compression"], sum(r["tokens"] for r in rs) / sum(r["forward_passes"] for r in rs))
        assert math.isclose(row["forward_passes_mean"], sum(r["forward_passes"] for r in rs) / len(rs))
        passes = sum(r["forward_passes"] for r in rs)
        assert math.isclose(row["overhead_ms_per_pass"], 1000 * sum(r["overhead_s"] for r in rs) / passes)
        assert row["speedup_q25"] <= row["speedup_median"] <= row["speedup_q75"]
        hist = data["histograms"][key]
        assert sum(hist.values()) == passes - len(rs)  # verification passes (prefill excluded)
        assert math.isclose(row["mean_accepted_length"], sum(int(n) * c for n, c in hist.items()) / sum(hist.values()))
    assert summary["ar"]["step_compression"] == 1.0 and summary["ar"]["speedup_median"] == 1.0
    assert summary["sjd-pac@16"]["step_compression"] > 1.0
    ratios = sorted(a["latency_s"] / b["latency_s"] for a in ar_runs for b in runs
                    if b["method"] == "sjd-pac@16" and (a["prompt_index"], a["seed"]) == (b["prompt_index"], b["seed"]))
    assert math.isclose(summary["sjd-pac@16"]["speedup_median"], float(np.median(ratios)))

    assert "| AR |" in md and "| SJD-PAC L=16 |" in md and "step compression" in md
    for name in ("acceptance_hist.png", "compression_vs_L.png", "speedup.png", "locality.png"):
        _assert_png(out / name)
    assert len(data["locality"]["tv"]) == 32


def test_lossless_end_to_end(bench_model_folder, tmp_path):
    out = tmp_path / "lossless"
    rc = main(["lossless", "--model", bench_model_folder, "--prompts", "1", "--seeds", "0-2", "--methods", "sjd-pac@16",
               "--permutations", "19", "--gumbel-pairs", "1", "--control-temperature", "0", "--out", str(out),
               "--quiet"])
    data = json.loads((out / "lossless.json").read_text())
    assert rc == (0 if data["passed"] else 1)
    assert data["gumbel"]["passed"]  # token-identical: deterministic, must hold
    row = data["comparisons"]["sjd-pac@16"]
    assert row["samples"] == [3, 3]
    assert set(row["p_values"]) == {"tokens_permutation_p", "tokens_per_position_min_p_bonferroni",
                                    "colour_histogram_permutation_p", "colour_features_ks_min_p_bonferroni"}
    assert all(0 < p <= 1 for p in row["p_values"].values())
    assert "Seed-exactness" in (out / "lossless.md").read_text()
    _assert_png(out / "gumbel_pairs.png")
    samples = torch.load(out / "samples.pt")
    assert samples["ar"].shape == samples["sjd-pac@16"].shape == (3, 272)


def test_prompt_files():
    demo, general = load_prompts("demo"), load_prompts("general")
    assert len(demo) >= 50 and len(general) >= 50
    assert len(set(demo)) == len(demo) and len(set(general)) == len(general)
    known = set(captions.CAPTION_WORDS)
    for prompt in demo:
        assert set(prompt.lower().replace(",", " ").split()) <= known, prompt
        captions.parse_caption(prompt)  # in the demo grammar
    vocab_file = DEMO_FOLDER / "vocab.json"
    if vocab_file.is_file():  # the shipped vocabulary knows every word
        words = set(json.loads(vocab_file.read_text())["words"])
        assert all(set(p.lower().split()) <= words for p in demo)
    assert (PROMPT_DIR / "demo.txt").is_file()
    with pytest.raises(ValueError, match="No prompt file"):
        load_prompts("no_such_set")


def test_method_grammar():
    specs = parse_methods(DEFAULT_METHODS)
    assert [s.key for s in specs] == DEFAULT_METHODS.split(",")
    assert len(specs) == 10
    assert parse_method("sjd-pac@auto") == MethodSpec("sjd-pac", "auto")
    assert parse_method("SJD_PAC@64").label == "SJD-PAC L=64"
    from sjd_pac_core import SamplerConfig

    base = SamplerConfig()
    c = parse_method("sjd+pd@32").config(base)
    assert (c.method, c.window, c.use_pd, c.use_ac) == ("sjd_pac", 32, True, False)
    c = parse_method("sjd+ac@64").config(base)
    assert (c.use_pd, c.use_ac) == (False, True)
    assert parse_method("ar").config(base).method == "ar"
    assert parse_method("sjd@16").config(base).method == "sjd"
    base = base.with_(tree_side_chain=16)
    no_side = parse_method("sjd-pac@32:s0:gumbel")
    assert no_side.key == "sjd-pac@32:gumbel:s0" and no_side.config(base).tree_side_chain == 0
    assert no_side.label == "SJD-PAC L=32, gumbel, side chain=0"
    assert parse_method(no_side.key) == no_side
    shaped = parse_method("sjd-pac@32:f0:d2:k6")
    assert shaped.key == "sjd-pac@32:d2:k6:f0" and parse_method(shaped.key) == shaped
    assert shaped.label == "SJD-PAC L=32, D=2, K=6, first K=0"
    c = shaped.config(SamplerConfig(tree_first_width=8))
    assert (c.tree_depth, c.tree_width, c.tree_first_width) == (2, 6, None)
    assert parse_method("sjd-pac@32:f8").config(SamplerConfig()).tree_first_width == 8
    for bad in ("fast@3", "sjd", "ar@4", "sjd@0", "sjd@x", "sjd-pac@4:s0:s0", "sjd@4:s0", "sjd@32:d2",
                "sjd-pac@32:d2:d3", "sjd-pac@32:x2"):
        with pytest.raises(ValueError):
            parse_method(bad)
    with pytest.raises(ValueError, match="twice"):
        parse_methods("ar,ar")
    # Lumina-mGPT 2.0's own SJD: window 16, random initial drafts, rejection sampling.
    theirs = parse_method(LUMINA2_AUTHORS_SJD)
    assert theirs.key == LUMINA2_AUTHORS_SJD == "sjd@16:rejection:random"
    assert parse_method("sjd@16:random:rejection") == theirs
    assert theirs.label == "SJD L=16, rejection, random drafts"
    c = theirs.config(SamplerConfig())
    assert (c.method, c.window, c.verify, c.init_proposal) == ("sjd", 16, "rejection", "uniform")
    assert method_key(c, SamplerConfig()) == theirs.key and [m.key for m in parse_methods("lumina2")][1] == theirs.key
    for bad in ("ar:random", "sjd@16:random:uniform"):
        with pytest.raises(ValueError):
            parse_method(bad)
    from sjd_pac_core.bench import drafting  # its counting row is the same method (--rules gives the rule)

    row = SamplerConfig().with_(**{"method": "sjd_pac", "window": 64, **drafting.VARIANTS[drafting.LUMINA2_AUTHORS]})
    assert (row.method, row.window, row.init_proposal) == (c.method, c.window, c.init_proposal)
    assert parse_seeds("0-3,7") == [0, 1, 2, 3, 7]
    with pytest.raises(ValueError):
        parse_seeds("a")


def test_statistics_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    for x, dof in [(3.2, 2), (40.0, 30), (0.5, 7)]:
        assert math.isclose(L.chi2_sf(x, dof), stats.chi2.sf(x, dof), rel_tol=1e-6)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=300), rng.normal(0.2, 1.0, size=250)
    d, p = L.ks_2samp(a, b)
    ref = stats.ks_2samp(a, b, method="asymp")
    assert math.isclose(d, ref.statistic, rel_tol=1e-9)
    assert abs(p - ref.pvalue) < 0.01
    ca, cb = rng.integers(0, 40, size=8), rng.integers(0, 40, size=8)
    stat, dof, p = L.chi2_homogeneity(ca + 10, cb + 10)
    ref = stats.chi2_contingency(np.array([ca + 10, cb + 10]), correction=False)
    assert math.isclose(stat, ref.statistic, rel_tol=1e-9) and dof == ref.dof


def test_permutation_test_is_calibrated_and_sees_a_shift():
    g = torch.Generator().manual_seed(0)
    strata = [0] * 30 + [1] * 30
    ps = []
    for k in range(20):  # same distribution: p-values are not small
        a = torch.randint(0, 6, (60, 4), generator=g) + torch.tensor(strata).unsqueeze(1) * 6
        b = torch.randint(0, 6, (60, 4), generator=g) + torch.tensor(strata).unsqueeze(1) * 6
        stat = lambda x, y: float((x.double().mean(0) - y.double().mean(0)).abs().sum())  # noqa: E731
        ps.append(L.permutation_test(stat, a, b, 49, k, strata, strata)[1])
    assert min(ps) > 0.01 and np.mean(ps) > 0.3
    shifted = torch.randint(0, 6, (60, 4), generator=g).clamp(min=2)
    assert L.permutation_test(stat, a, shifted, 49, 0, strata, strata)[1] <= 0.02


# --- issue 13: honest baselines; issue 15: the rule grid and the fp32/bf16 numerics ------------


def test_method_modifiers_presets_and_rule_grid():
    from sjd_pac_core import SamplerConfig
    from sjd_pac_core.bench.methods import BASELINE_METHODS, rule_grid, with_rules

    spec = parse_method("sjd-pac@64:gumbel:compile")
    assert (spec.variant, spec.window, spec.verify, spec.compiled) == ("sjd-pac", 64, "gumbel", True)
    assert spec.key == "sjd-pac@64:gumbel:compile" and parse_method(spec.key) == spec
    assert spec.label == "SJD-PAC L=64, gumbel, compiled"
    c = spec.config(SamplerConfig(verify="rejection"))
    assert (c.method, c.window, c.verify, c.compile) == ("sjd_pac", 64, "gumbel", True)
    g = parse_method("generate-static:compile")
    assert g.is_ar and g.is_generate and g.compiled
    assert g.config(SamplerConfig()).compile is False  # compiled by transformers, not by our engine
    assert parse_method("ar:compile").config(SamplerConfig()).compile is True
    assert parse_method("generate").is_ar and not parse_method("sjd@8").is_ar
    for bad in ("generate:compile", "generate@8", "sjd@8:gumbel:rejection", "ar:fast", "sjd@8:compile:compile"):
        with pytest.raises(ValueError):
            parse_method(bad)
    assert [s.key for s in parse_methods("baselines")] == BASELINE_METHODS.split(",")
    assert {s.key for s in parse_methods("baselines")} >= {"generate", "generate-static:compile", "ar",
                                                           "ar:compile", "sjd-pac@32", "sjd-pac@32:compile"}
    grid = rule_grid()
    assert len(grid) == 2 + 4 * 4 * 2 and len({s.key for s in grid}) == len(grid)
    assert {s.verify for s in grid} == {"rejection", "gumbel"}
    crossed = with_rules(parse_methods("ar,sjd@8:gumbel"), ["rejection", "gumbel"])
    assert [s.key for s in crossed] == ["ar:rejection", "ar:gumbel", "sjd@8:gumbel"]


def _record(method, prompt, latency, forward=0.5):
    from sjd_pac_core.bench.summary import RunRecord

    return RunRecord(method=method, prompt_index=prompt, seed=0, order=0, tokens=10, forward_passes=10,
                     step_compression=1.0, latency_s=latency, sampler_s=latency * 0.9, forward_s=forward,
                     accept_lengths=[1] * 10, windows=[0] * 10, tree_nodes=0, kept_by_ac=0, token_digest="x")


def test_speedups_are_against_the_fastest_ar_row():
    from sjd_pac_core.bench.report import markdown_table
    from sjd_pac_core.bench.summary import fastest_ar, summarise

    runs = []
    for p, (ar, comp, gen, pac) in enumerate([(4.0, 2.0, 3.0, 1.0), (4.0, 2.2, 3.0, 1.1), (4.0, 1.8, 3.0, 0.9)]):
        runs += [_record("ar", p, ar), _record("ar:compile", p, comp), _record("generate", p, gen, forward=None),
                 _record("sjd-pac@32", p, pac)]
    keys = ["ar", "ar:compile", "generate", "sjd-pac@32"]
    assert fastest_ar(runs, keys) == "ar:compile"  # SJD-PAC is faster still, but it is not an AR row
    summary = summarise(runs, keys)
    assert all(row["speedup_reference"] == "ar:compile" for row in summary.values())
    assert summary["ar:compile"]["speedup_median"] == 1.0
    assert math.isclose(summary["sjd-pac@32"]["speedup_median"], 2.0)
    assert math.isclose(summary["ar"]["speedup_median"], 0.5)
    assert summary["generate"]["overhead_ms_per_pass"] is None
    md = markdown_table(summary)
    assert "vs fastest AR (AR, compiled)" in md and "| - | - |" in md
    # a planted bug: taking our eager AR as the reference would report 4x, not 2x
    assert math.isclose(summarise(runs, keys, reference="ar")["sjd-pac@32"]["speedup_median"], 4.0)


def test_generate_baseline_does_our_ar_work(bench_model_folder):
    """transformers' generate with RecipeLogitsProcessor returns our AR's tokens under the gumbel
    rule (same CFG, constraints, temperature, noise); with a different recipe it does not."""
    import sjd_pac_core as sp
    from sjd_pac_core.bench.baselines import GenerateBaseline

    model = sp.load_model(bench_model_folder)
    prompt = load_prompts("demo", 1)[0]
    encoding = model.encode_prompt(prompt)
    config = model.defaults.sampler_config(method="ar", verify="gumbel")
    assert config.uses_cfg  # the demo's defaults guide: the baseline must do batched CFG
    ours = sp.sample_tokens(model, encoding.prompt_ids, encoding.layout.num_tokens, config=config, seed=3,
                            uncond_prompt_ids=encoding.uncond_ids, allowed_tokens=encoding.constraints).tokens
    for static in (False, True):
        out = GenerateBaseline(model, static=static, compiled=False, prompt_width=12).generate(encoding, config, 3)
        assert torch.equal(out.tokens, ours), f"static={static}"
    control = GenerateBaseline(model, static=False, compiled=False).generate(encoding, config.with_(cfg_scale=1.0), 3)
    assert not torch.equal(control.tokens, ours)


def test_bench_baselines_and_rules_end_to_end(bench_model_folder, tmp_path):
    out = tmp_path / "grid"
    rc = main(["bench", "--model", bench_model_folder, "--prompts", "1", "--methods", "generate,ar,sjd-pac@16",
               "--rules", "rejection,gumbel", "--out", str(out), "--quiet", "--no-warmup", "--no-plots"])
    assert rc == 0
    data = json.loads((out / "results.json").read_text())
    keys = [m["key"] for m in data["methods"]]
    assert keys == ["generate:rejection", "generate:gumbel", "ar:rejection", "ar:gumbel", "sjd-pac@16:rejection",
                    "sjd-pac@16:gumbel"]
    summary, found = data["summary"], data["findings"]
    ar_rows = [k for k in keys if not k.startswith("sjd")]
    reference = min(ar_rows, key=lambda k: summary[k]["latency_s"]["median"])
    assert found["speedup_reference"] == reference and summary[reference]["speedup_median"] == 1.0
    assert {r["method"] for r in found["rules"]} == {"sjd-pac@16"}  # AR rows have no compression to compare
    rules = {r["method"]: r for r in found["rules"]}
    assert math.isclose(rules["sjd-pac@16"]["compression_gumbel"], summary["sjd-pac@16:gumbel"]["step_compression"])
    assert found["seed_exact"]["generate:gumbel"] == {"against": "ar:gumbel", "pairs": 1, "identical": 1}
    assert found["seed_exact"]["sjd-pac@16:gumbel"]["identical"] == 1
    for r in data["runs"]:
        assert (r["forward_s"] is None) == r["method"].startswith("generate")
    assert set(data["histograms"]) == set(keys)
    md = (out / "results.md").read_text()
    assert "transformers generate, gumbel" in md and "rejection / gumbel" in md


@pytest.mark.slow  # bf16 matmuls on the CPU: four 272-token generations, ~50 s
def test_numerics_counts_flips_and_the_teacher_forced_rule_is_ar(bench_model_folder, tmp_path):
    import sjd_pac_core as sp
    from sjd_pac_core.bench.numerics import gumbel_scores

    out = tmp_path / "numerics"
    rc = main(["bench", "--numerics", "--model", bench_model_folder, "--prompts", "1", "--methods", "sjd@16",
               "--out", str(out), "--quiet"])
    assert rc == 0
    data = json.loads((out / "numerics.json").read_text())
    tf = data["teacher_forced"]
    assert tf["decisions"] == 256  # 16 x 16 free positions (the 16 end-of-lines are forced)
    assert tf["flips_fp32_whole_vs_incremental"] == 0  # fp32: the rule replayed on AR's tokens is AR
    assert 0 <= tf["flips_fp32_vs_bf16"] <= tf["decisions"] and len(tf["gap_at_flips"]) == tf["flips_fp32_vs_bf16"]
    assert data["images"]["sjd@16 vs ar (fp32)"]["identical"] == 1
    assert set(data["images"]) == {"ar fp32 vs ar bf16", "sjd@16 vs ar (bf16)", "sjd@16 vs ar (fp32)"}
    assert "fp32 vs bf16" in (out / "numerics.md").read_text()
    # planted bug: the scores of another seed's noise do not reproduce the sample
    model = sp.load_model(bench_model_folder)
    encoding = model.encode_prompt(load_prompts("demo", 1)[0])
    config = model.defaults.sampler_config(method="ar", verify="gumbel")
    tokens = sp.sample_tokens(model, encoding.prompt_ids, encoding.layout.num_tokens, config=config, seed=0,
                              uncond_prompt_ids=encoding.uncond_ids, allowed_tokens=encoding.constraints).tokens
    assert torch.equal(gumbel_scores(model, encoding, tokens, config, seed=0).argmax(-1), tokens)
    assert (gumbel_scores(model, encoding, tokens, config, seed=1).argmax(-1) != tokens).sum() > 50


def test_gpu_script_runs_tiny_on_cpu(tmp_path):
    from sjd_pac_core.bench.hardware import main as gpu_main

    out = tmp_path / "gpu"
    rc = gpu_main(["--tiny", "--device", "cpu", "--out", str(out), "--max-window", "4", "--rounds", "1",
                   "--overhead-methods", "ar,sjd-pac@8", "--demo-methods", "ar,generate"])
    assert rc == 0
    data = json.loads((out / "gpu_bench.json").read_text())
    assert [s["shape"]["family"] for s in data["shapes"]] == ["chameleon", "emu3"]
    for shape in data["shapes"]:
        assert len(shape["curves"]) == 2  # half-way through the image and at its end
        for curve in shape["curves"]:
            assert list(curve["ratio"]) == ["1", "2", "3", "4"] and curve["ratio"]["1"] == 1.0
            assert all(v > 0 for v in curve["ms"].values())
        assert [r["method"] for r in shape["overhead"]] == ["ar", "sjd-pac@8"]
        assert all(r["passes"] >= 1 for r in shape["overhead"])
    assert set(data["demo"]["summary"]) == {"ar", "generate"}
    assert "t(L)/t(1)" in (out / "gpu_bench.md").read_text()
    from sjd_pac_core.models.quantize import available_precisions

    rows = data["quantized"]["rows"]  # the quantized rows: every precision this machine can load
    assert [r["precision"] for r in rows] == list(available_precisions(torch.device("cpu")))
    assert all(r["sjd_pac_equals_ar"] for r in rows)


def test_bench_settings_go_through_the_one_conversion():
    """The bench's shared settings mean what they mean for `sjd-pac generate`: top-k 0 and top-p 1
    are off, --tree-first-width 0 is K at every level, --tree-side-chain counts (it was ignored)."""
    import sjd_pac_core as sp
    from sjd_pac_core.bench.cli import _base_config
    from sjd_pac_core.cli import build_parser

    model = sp.load_model("demo")
    def parse(*argv):
        argv = ["bench", *argv]
        return build_parser(argv).parse_args(argv)

    args = parse("--top-k", "0", "--top-p", "1", "--tree-first-width", "0", "--tree-side-chain", "4", "-D", "3",
                 "-K", "2", "--cfg-scale", "1.5")
    config = _base_config(model, args)
    assert (config.top_k, config.top_p, config.tree_first_width, config.tree_side_chain) == (None, None, None, 4)
    assert (config.tree_depth, config.tree_width, config.cfg_scale) == (3, 2, 1.5)
    assert _base_config(model, parse()) == model.defaults.sampler_config()
    with pytest.raises(sp.ConfigError, match="top_k must be 0"):
        _base_config(model, parse("--top-k", "-2"))
