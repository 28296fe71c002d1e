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
from sjd_pac_core.bench.cli import parse_seeds
from sjd_pac_core.bench.runner import (
    DEFAULT_METHODS,
    PROMPT_DIR,
    MethodSpec,
    load_prompts,
    parse_method,
    parse_methods,
)
from sjd_pac_core.cli import main
from sjd_pac_core.demo import data as D
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
    known = set(D.CAPTION_WORDS)
    for prompt in demo:
        assert set(prompt.lower().replace(",", " ").split()) <= known, prompt
        D.parse_caption(prompt)  # in the demo grammar
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
    for bad in ("fast@3", "sjd", "ar@4", "sjd@0", "sjd@x"):
        with pytest.raises(ValueError):
            parse_method(bad)
    with pytest.raises(ValueError, match="twice"):
        parse_methods("ar,ar")
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
