"""benchmarks/gpu_e2e.py: the 7B-cost twin of the demo model, the end-to-end table, its checks.

No timing is asserted (speed comes from the benchmark command); what is checked: the twin runs
the big model over the same nodes and cache growth as the demo in every pass and returns the
demo's tokens, the tiny command reports every row with AR's tokens and a planted control that is
not, the ratios are taken against the right rows, and bad input is one sentence before any work.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sjd_pac_core as sp
from sjd_pac_core.bench import e2e
from sjd_pac_core.bench.methods import parse_methods
from sjd_pac_core.bench.runner import load_prompts
from sjd_pac_core.bench.shapes import TINY_SHAPES, build_random_model, family_adapter
from sjd_pac_core.bench.twin import TwinImageModel

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def twin():
    shape = TINY_SHAPES[e2e.TINY_SHAPE]
    torch.manual_seed(0)
    big = build_random_model(shape, torch.float32, torch.device("cpu"))
    return TwinImageModel(sp.load_model("demo"), family_adapter(big, shape, torch.device("cpu")), shape, rows=3)


def _record_passes(module: torch.nn.Module, calls: list):
    """A forward pre-hook on a real decoder: (rows, nodes, position ids) of every call."""

    def hook(_module, args, kwargs):
        inputs = kwargs.get("input_ids", kwargs.get("inputs_embeds"))
        calls.append((inputs.shape[0], inputs.shape[1], kwargs["position_ids"].clone()))

    return module.register_forward_pre_hook(hook, with_kwargs=True)


def test_twin_runs_the_big_model_in_every_pass_and_samples_the_demos_tokens(twin):
    """In every pass after the prompt's, the big model sees as many rows and nodes as the demo,
    at positions a constant offset (its longer prompt) from the demo's: the same cache growth.
    The twin's tokens and accept lengths are the demo's alone (its logits are the demo's)."""
    demo = twin.demo
    encoding = twin.encode_prompt(load_prompts("demo", 1)[0])
    n = encoding.layout.num_tokens
    assert n == 3 * 17  # the strip of three rows
    for config in (twin.defaults.sampler_config(window=16),
                   twin.defaults.sampler_config(window="auto", node_budget=32)):
        big_calls, demo_calls = [], []
        hooks = [_record_passes(twin.token_model.cost_model.model.get_decoder(), big_calls),
                 _record_passes(demo.token_model.model.get_decoder(), demo_calls)]
        try:
            ours = sp.sample_tokens(twin, encoding.prompt_ids, n, config=config, seed=5,
                                    uncond_prompt_ids=encoding.uncond_ids, allowed_tokens=encoding.constraints)
        finally:
            for h in hooks:
                h.remove()
        alone = sp.sample_tokens(demo, encoding.prompt_ids, n, config=config, seed=5,
                                 uncond_prompt_ids=encoding.uncond_ids, allowed_tokens=encoding.constraints)
        assert torch.equal(ours.tokens, alone.tokens)
        assert ours.stats.accept_lengths == alone.stats.accept_lengths
        assert len(big_calls) == len(demo_calls) == ours.stats.forward_passes
        context = twin.token_model.context
        assert big_calls[0][1] == context.prompt_tokens + context.before  # the big prompt stands for half an image
        offsets = set()
        for (rows, nodes, positions), (demo_rows, demo_nodes, demo_positions) in zip(big_calls[1:], demo_calls[1:]):
            assert (rows, nodes) == (demo_rows, demo_nodes) == (2, nodes)
            offsets.add(tuple((positions - demo_positions)[:, 0].tolist()))
            assert bool(((positions - demo_positions) == (positions - demo_positions)[:, :1]).all())
        assert len(offsets) == 1  # one offset per row for the whole run: the caches grew alike


def test_ratios_are_against_the_fastest_plain_ar_and_eager_generate():
    rows = e2e.method_rows("generate-static,generate-static:compile,ar,sjd-pac@auto:b32")
    rows += e2e.pass_rows(rows)
    tokens_per_second = {"generate-static": 10.0, "generate-static:compile": 40.0, "ar": 20.0,
                         "sjd-pac@auto:b32": 100.0}
    runs = [e2e.Run(key, 0, r, seconds=100 / tps, tokens=100, total_seconds=1.0, passes=25 if "b32" in key else 100,
                    step_compression=4.0 if "b32" in key else 1.0)
            for key, tps in tokens_per_second.items() for r in (0, 1)]
    costs = [e2e.PassCost("pass:1", 1, [10.0, 10.0], 50.0), e2e.PassCost("pass:33", 33, [20.0], 60.0)]
    checks = {key: [True] for key in tokens_per_second}
    checks["ar"] = [True, False]  # one bad run makes the row NO
    results = {r.key: r for r in e2e.row_results(rows, runs, costs, checks)}
    assert results["sjd-pac@auto:b32"].vs_fastest_ar == pytest.approx(2.5)  # against compiled generate
    assert results["sjd-pac@auto:b32"].vs_eager_generate == pytest.approx(10.0)
    assert results["generate-static:compile"].vs_fastest_ar == pytest.approx(1.0)
    assert results["ar"].round_seconds == pytest.approx([5.0, 5.0])
    assert results["ar"].ar_tokens is False and results["sjd-pac@auto:b32"].ar_tokens is True
    assert results["pass:1"].ar_tokens is None and results["pass:33"].pass_vs_one_node == pytest.approx(2.0)
    assert results["pass:33"].bound_tokens_per_s == pytest.approx(4.0 * 1000 / 20.0)  # the b32 row's compression


@pytest.mark.slow  # a dozen rows, six compiled (traced, no kernels generated): about a minute of CPU
def test_tiny_command_reports_every_row_with_ars_tokens_and_a_failing_control(tmp_path):
    out = tmp_path / "e2e"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_e2e.py"), "--tiny", "--device", "cpu",
                           "--profile", "best", "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                          timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((out / "gpu_e2e.json").read_text())
    rows = {r["key"]: r for r in record["rows"]}
    methods = [spec.key for spec in parse_methods(e2e.DEFAULT_METHODS)]
    assert methods == e2e.DEFAULT_METHODS.split(",")
    passes = [f"pass:{n}{mode}" for mode in ("", ":compile") for n in (1, 33, 65, 129)]
    assert list(rows) == methods + passes
    for key in methods:
        row = rows[key]
        assert row["ar_tokens"] is True, key
        assert row["runs"] == record["setup"]["rounds"] and row["tokens_per_s"] > 0 and row["warmup_s"] > 0, key
        assert row["vs_fastest_ar"] > 0 and row["vs_eager_generate"] > 0, key
    for key in passes:
        assert rows[key]["pass_ms"] > 0 and rows[key]["bound_tokens_per_s"] > 0, key
    assert rows["sjd-pac@auto:b128"]["step_compression"] > 1.5
    assert all(rows[k]["max_syncs_per_pass"] == 1 for k in methods if not k.startswith("generate"))
    # the planted control: the same sampler with another seed does not return AR's tokens
    assert record["control"]["ar_tokens"] is False and record["control"]["seed"] == record["setup"]["seed"] + 1
    env = record["environment"]
    assert env["torch"] and env["transformers"] and env["date_utc"]
    assert record["command"] == f"python benchmarks/gpu_e2e.py --tiny --device cpu --profile best --out {out}"
    top = record["headline"]
    assert top["best"] in methods and top["fastest_plain_ar"] in methods and top["best_returned_ar_tokens"] is True
    report = (out / "gpu_e2e.md").read_text()
    assert "vs fastest plain AR" in report and "Fastest SJD-PAC row" in report and "no, as it must" in report
    assert not (out / e2e.PARTIAL_FILE).exists()  # the runs so far are gone once the record is written
    # --profile best: the fastest SJD-PAC row once more, its pass time by stage, with its trace
    profiled = record["profile"]
    assert profiled["row"] == top["best"] and profiled["passes"] > 0 and Path(profiled["trace"]).is_file()
    stages = {t["stage"]: t for t in profiled["stages"]}
    assert list(stages) == ["plan", "forward", "verify", "sync", "commit", "draft"]
    assert all(t["calls"] > 0 and t["host_ms_per_pass"] > 0 for t in stages.values())
    assert stages["forward"]["calls"] == profiled["passes"]
    assert "Where a pass's time goes" in report and "| draft |" in report


@pytest.mark.parametrize("argv, says", [
    (["--tiny", "--device", "cpu", "--methods", "ar,sjd-pac@auto:bauto:compile"], "node_budget='auto'"),
    (["--tiny", "--device", "cpu", "--methods", "generate-static,generate-static:compile"], "add ar"),
    (["--tiny", "--device", "cpu", "--methods", "ar,sjd@16:rejection"], "gumbel"),
    (["--tiny", "--device", "cpu", "--methods", "ar,sjd-pac@64:b32:b64"], "Modifier"),
    (["--device", "cpu"], "--tiny"),
    (["--tiny", "--device", "tpu"], "tpu"),
    (["--tiny", "--device", "cpu", "--methods", "ar,ar:compile", "--profile", "best"], "no SJD-PAC row"),
    (["--tiny", "--device", "cpu", "--methods", "ar,sjd-pac@64", "--profile", "sjd-pac@32"], "one of ar, sjd-pac@64"),
])
def test_bad_input_is_one_sentence_before_any_work(argv, says, monkeypatch):
    monkeypatch.setattr(e2e, "build", lambda *a, **k: pytest.fail("built models before checking the command"))
    with pytest.raises(SystemExit) as exc:
        e2e.main(argv + ["--out", "unused"])
    message = str(exc.value)
    assert says in message and "\n" not in message and message.endswith("."), message


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_one_sentence(monkeypatch):
    monkeypatch.setattr(e2e, "build", lambda *a, **k: pytest.fail("built models before checking the command"))
    with pytest.raises(SystemExit) as exc:
        e2e.main(["--device", "cuda", "--out", "unused"])
    message = str(exc.value)
    assert "no CUDA GPU" in message and "--tiny --device cpu" in message and message.count(".") == 1, message
