"""The engine's counting guarantees: one host sync per pass, compaction moves only the accepted
entries, the Gumbel noise is hashed about once per position, the generic adapter computes only
the allowed head rows, and a new drafter plugs in without touching the loop.

Counting only (never wall-clock): the machine running the tests is shared.
"""

from __future__ import annotations

import os

import pytest
import torch

import sjd_pac_core as sp
from exactness_tools import seed_exact_lm
from sjd_pac_core.config import TreeLevels
from sjd_pac_core.engine import drafters
from sjd_pac_core.models import causal_lm
from sjd_pac_core.models.causal_lm import CausalLMAdapter
from sjd_pac_core.sampling import rules
from sjd_pac_core.sampling.tree import build_tree_layout

PROMPT = torch.tensor([5, 9, 13, 21, 3])
UNCOND = torch.tensor([5, 3])
NUM_TOKENS = 80


@pytest.fixture(scope="module")
def lm():
    return seed_exact_lm()


# Every Python-level way a tensor's value reaches the host.
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")


@pytest.mark.parametrize("verify", ["rejection", "gumbel"])
@pytest.mark.parametrize("variant", [
    dict(method="ar"),
    dict(method="sjd", window=8),
    dict(method="sjd_pac", window=16, tree_width=3),
    dict(method="sjd_pac", window=16, node_budget=24),
], ids=["ar", "sjd", "sjd_pac", "sjd_pac_budget"])
def test_one_host_sync_per_pass(lm, monkeypatch, verify, variant):
    """Counts every read of a tensor value on the host between two passes' callbacks. On the
    CPU every tensor is a host tensor, so this also counts reads that would not sync a GPU:
    the loop keeps host-side facts as Python ints, and the count must be exactly one."""
    reads = {"n": 0}
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _original=original, **kwargs):
            reads["n"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    per_pass = []
    last = {"n": None}

    def callback(progress):
        if last["n"] is not None:
            per_pass.append(reads["n"] - last["n"])
        last["n"] = reads["n"]

    config = sp.SamplerConfig(**variant, verify=verify, cfg_scale=2.0, top_k=40)
    out = sp.sample_tokens(lm, PROMPT, NUM_TOKENS, config=config, seed=3, uncond_prompt_ids=UNCOND,
                           callback=callback)
    monkeypatch.undo()
    assert len(per_pass) == out.stats.forward_passes - 1  # every pass after the prefill
    assert per_pass and set(per_pass) == {1}, per_pass
    assert all(r.host_syncs == 1 for r in out.stats.records)
    if variant["method"] == "sjd_pac":
        assert any(r.tree_nodes > 0 for r in out.stats.records)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (sync debug mode)")
def test_no_hidden_sync_on_cuda():
    model = seed_exact_lm().cuda()
    config = sp.SamplerConfig(method="sjd_pac", window=16, verify="gumbel")
    sp.sample_tokens(model, PROMPT.cuda(), 20, config=config, seed=0)  # warm-up (allocations)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning) as caught:
            out = sp.sample_tokens(model, PROMPT.cuda(), NUM_TOKENS, config=config, seed=0)
            torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    # one per pass, plus the prefill's timing and the final copy of the tokens
    assert len(syncs) <= out.stats.forward_passes + 2, len(syncs)


def _kv_shape(model):
    config = model.config
    heads = config.num_key_value_heads
    head_dim = config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, heads, head_dim


@torch.no_grad()
def test_compaction_moves_only_the_accepted_entries(lm):
    """Keeping an off-main path copies exactly the moved entries (keys + values, every layer),
    and keeping a prefix (a chain pass, or a rollback) copies nothing."""
    adapter = CausalLMAdapter(lm)
    session = adapter.open_session([PROMPT, UNCOND])
    session.configure(256)
    session.prefill()
    chain = build_tree_layout((), 3)
    session.forward(torch.tensor([7, 8, 9, 10]), chain.depths, chain.attend)
    session.keep([0, 1, 2])  # a chain pass keeps a prefix: already in place
    assert session.compaction_bytes == 0
    layout = build_tree_layout((2, 2), 2)
    tokens = torch.tensor([7, 11, 12, 20, 21, 20, 21, 30, 31])
    session.forward(tokens, layout.depths, layout.attend)
    session.keep([0, 2, 6])  # candidate 1 at both levels: nodes 2 and 6 move, the root stays
    layers, heads, head_dim = _kv_shape(lm)
    per_entry = layers * 2 * 2 * heads * head_dim * 4  # layers x (K, V) x CFG rows x heads x dim x fp32
    assert session.compaction_bytes == 2 * per_entry
    before = session.compaction_bytes
    session.forward(tokens[:3], torch.arange(3), torch.ones(3, 3, dtype=torch.bool).tril())
    session.keep([])  # rollback: the write pointer moves back, nothing is copied
    assert session.compaction_bytes == before
    session.close()


def test_compaction_per_run_is_bounded_by_the_accepted_tokens(lm, monkeypatch):
    sessions = []
    original = CausalLMAdapter.open_session

    def spy(self, prompts):
        sessions.append(original(self, prompts))
        return sessions[-1]

    monkeypatch.setattr(CausalLMAdapter, "open_session", spy)
    config = sp.SamplerConfig(method="sjd_pac", window=16, tree_width=4, verify="gumbel")
    branches = 0
    for seed in range(3):
        out = sp.sample_tokens(lm, PROMPT, NUM_TOKENS, config=config, seed=seed)
        branches += sum(1 for r in out.stats.records if any(r.branch))
        layers, heads, head_dim = _kv_shape(lm)
        per_token = layers * 2 * heads * head_dim * 4
        records = out.stats.records[1:]
        # per pass: only the accepted tokens' entries move (the bonus token has no entry yet)
        assert all(r.compaction_bytes <= (r.committed - 1) * per_token for r in records)
        assert sum(r.compaction_bytes for r in records) == sessions[-1].compaction_bytes
    assert branches > 0, "no pass left the main branch: compaction went untested"


def test_gumbel_noise_is_hashed_about_once_per_position(lm, monkeypatch):
    hashed = {"rows": 0}
    original = rules.gumbel_noise

    def counting(seed, positions, vocab_size):
        hashed["rows"] += int(positions.numel())
        return original(seed, positions, vocab_size)

    monkeypatch.setattr(rules, "gumbel_noise", counting)
    config = sp.SamplerConfig(method="sjd_pac", window=16, verify="gumbel")
    out = sp.sample_tokens(lm, PROMPT, NUM_TOKENS, config=config, seed=0)
    assert out.stats.forward_passes < NUM_TOKENS
    span = 16 + config.tree_depth + 2
    assert hashed["rows"] <= NUM_TOKENS + 2 * span, hashed


def test_generic_adapter_computes_only_the_allowed_head_rows(lm, monkeypatch):
    allowed = list(range(10, 40))
    config = sp.SamplerConfig(method="sjd_pac", window=16, verify="gumbel", cfg_scale=2.0)
    adapter = CausalLMAdapter(lm)
    restricted = sp.sample_tokens(adapter, PROMPT, NUM_TOKENS, config=config, seed=2,
                                  uncond_prompt_ids=UNCOND, allowed_tokens=allowed)
    assert adapter.restricted_rows is not None and adapter.restricted_rows.shape[0] == len(allowed)
    monkeypatch.setattr(causal_lm, "PLAIN_HEAD_MODEL_TYPES", ())
    full_adapter = CausalLMAdapter(lm)
    full = sp.sample_tokens(full_adapter, PROMPT, NUM_TOKENS, config=config, seed=2,
                            uncond_prompt_ids=UNCOND, allowed_tokens=allowed)
    assert full_adapter.restricted_rows is None
    assert torch.equal(restricted.tokens, full.tokens)


def test_restricted_head_in_a_token_space(lm, monkeypatch):
    """With a token space (sampler id i = model id space[i]) the head rows are the space's."""
    space = torch.arange(8, 56)
    config = sp.SamplerConfig(method="sjd_pac", window=16, verify="gumbel")
    adapter = CausalLMAdapter(lm, token_space=space)
    restricted = sp.sample_tokens(adapter, PROMPT, NUM_TOKENS, config=config, seed=4, allowed_tokens=list(range(40)))
    assert adapter.restricted_rows.shape[0] == 40
    assert torch.equal(adapter.restricted_rows, lm.lm_head.weight[8:48])
    monkeypatch.setattr(causal_lm, "PLAIN_HEAD_MODEL_TYPES", ())
    full = sp.sample_tokens(CausalLMAdapter(lm, token_space=space), PROMPT, NUM_TOKENS, config=config, seed=4,
                            allowed_tokens=list(range(40)))
    assert torch.equal(restricted.tokens, full.tokens)


class TreeEveryPassDrafter(drafters.PACDrafter):
    """A drafter that differs from the built-in ones: a PD tree after every pass."""

    def next_tree(self, ctx, report, window):
        return self.shaped_tree(ctx, window, report.num_committed, self.tree.widths)


def test_a_new_drafter_plugs_in_without_touching_the_loop(lm, monkeypatch):
    common = dict(verify="gumbel", cfg_scale=2.0, top_k=40)
    ar = sp.sample_tokens(lm, PROMPT, NUM_TOKENS, config=sp.SamplerConfig(method="ar", **common),
                          seed=5, uncond_prompt_ids=UNCOND)
    monkeypatch.setattr(drafters, "make_drafter", lambda config: TreeEveryPassDrafter(True, True, TreeLevels.of(3, 3)))
    out = sp.sample_tokens(lm, PROMPT, NUM_TOKENS, config=sp.SamplerConfig(window=16, **common),
                           seed=5, uncond_prompt_ids=UNCOND)
    assert torch.equal(out.tokens, ar.tokens)
    assert all(r.tree_nodes > 0 for r in out.stats.records[2:])  # a tree at every pass after the first


def _compiled_and_eager(lm):
    common = dict(method="sjd_pac", window=8, tree_width=2, verify="gumbel", cfg_scale=2.0)
    eager = sp.sample_tokens(lm, PROMPT, 40, config=sp.SamplerConfig(**common), seed=1, uncond_prompt_ids=UNCOND)
    compiled = sp.sample_tokens(lm, PROMPT, 40, config=sp.SamplerConfig(compile=True, **common), seed=1,
                                uncond_prompt_ids=UNCOND)
    assert torch.equal(compiled.tokens, eager.tokens)
    assert compiled.stats.warmup_time > 0
    assert len({r.envelope for r in compiled.stats.records[1:]}) <= 2  # chain and tree passes


@pytest.mark.slow
def test_compiled_passes_trace_and_give_the_eager_tokens(lm, monkeypatch):
    """torch.compile traces the fixed-shape pass through our cache (the aot_eager backend: the
    same graph capture, no kernel generation, so it stays fast) and gives the eager tokens."""
    torch._dynamo.reset()
    monkeypatch.setattr(causal_lm, "COMPILE_BACKEND", "aot_eager")
    _compiled_and_eager(lm)
    torch._dynamo.reset()


@pytest.mark.slow
def test_compiled_shipped_tree_keeps_the_ar_tokens_and_sees_a_position_fault(lm, monkeypatch):
    """The compiled pass (aot_eager) through the shipped tree (first level 8, K = 4) with chain
    siblings, window 32 and CFG with a shorter, left-padded unconditional prompt: under the gumbel
    rule the tokens are AR's; the same graphs then run the rejection rule, whose tokens for the
    seed are the eager run's. Control: a position id one off past depth 8 changes the compiled
    run's tokens (the graph reads the position ids it is given, and the comparison can fail)."""
    from exactness_tools import planted_fault

    torch._dynamo.reset()
    monkeypatch.setattr(causal_lm, "COMPILE_BACKEND", "aot_eager")
    adapter = CausalLMAdapter(lm)
    common = dict(method="sjd_pac", window=32, tree_chain_width=2, cfg_scale=2.0, top_k=40)

    def tokens(seed=2, **fields):
        config = sp.SamplerConfig(**{**common, **fields})
        return sp.sample_tokens(adapter, PROMPT, 80, config=config, seed=seed, uncond_prompt_ids=UNCOND).tokens

    ar = tokens(method="ar", verify="gumbel")
    assert torch.equal(tokens(verify="gumbel", compile=True), ar)
    assert torch.equal(tokens(verify="rejection", compile=True), tokens(verify="rejection"))
    differs = False
    with planted_fault("deep_positions") as calls:
        for seed in (2, 3, 4, 5):  # a seed whose passes reach past depth 8 often enough to show it
            differs = not torch.equal(tokens(seed, verify="gumbel", compile=True), tokens(seed, method="ar", verify="gumbel"))
            if differs:
                break
    torch._dynamo.reset()
    assert calls.count > 0 and differs


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SJD_PAC_TEST_INDUCTOR") != "1",
                    reason="inductor compiles for minutes on a small CPU; set SJD_PAC_TEST_INDUCTOR=1")
def test_compiled_passes_give_the_eager_tokens(lm):
    """The default backend (inductor on the CPU, CUDA graphs on a GPU), fp32: the same tokens
    as eager, seed for seed. Opt-in: generating kernels takes minutes on a loaded 2-core CPU."""
    torch._dynamo.reset()
    _compiled_and_eager(lm)
    torch._dynamo.reset()


def test_compiled_sessions_share_one_cache_capacity_across_prompt_lengths(lm):
    """A compiled pass is specialised to the cache's capacity: prompts of different lengths must
    land on the same capacity (else every new prompt length recompiles), eager ones need not."""
    adapter = CausalLMAdapter(lm)

    def capacity(prompt: torch.Tensor, compile: bool) -> int:
        session = adapter.open_session([prompt])
        session.configure(extra_tokens=300, compile=compile)
        try:
            return session.cursor.capacity
        finally:
            session.close()

    short, longer = PROMPT[:2], torch.cat([PROMPT, PROMPT, PROMPT])
    assert capacity(short, True) == capacity(longer, True) >= 300 + len(longer)
    assert capacity(short, False) != capacity(longer, False)


@pytest.mark.slow
def test_compiled_runs_build_one_graph_per_pass_size_across_prompt_lengths(lm, monkeypatch):
    """The loop must size a compiled session's cache before the prefill: before this was so,
    every prompt length got its own capacity, every run recompiled, and a 24-image benchmark hit
    torch.compile's recompile limit and fell back to eager. Two prompt lengths: two graphs in all,
    the envelopes 1 + L (chain passes) and 1 + L + side (tree passes) that the warm-up builds."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    monkeypatch.setattr(causal_lm, "COMPILE_BACKEND", counter)
    adapter = CausalLMAdapter(lm)  # one adapter, as a loaded model keeps
    config = sp.SamplerConfig(method="sjd_pac", window=8, tree_width=2, verify="gumbel", cfg_scale=2.0, compile=True)
    envelopes = set()
    for prompt in (PROMPT, torch.cat([PROMPT, PROMPT, PROMPT])):
        out = sp.sample_tokens(adapter, prompt, 40, config=config, seed=1, uncond_prompt_ids=UNCOND)
        envelopes |= {r.envelope for r in out.stats.records[1:]}
    torch._dynamo.reset()
    assert envelopes <= {9, 9 + drafters.make_drafter(config).max_side_nodes}
    assert counter.frame_count == 2  # the warm-up's two envelopes, compiled once for both prompts


@pytest.mark.slow
def test_a_compiled_node_budget_runs_one_graph_at_one_shape(lm, monkeypatch):
    """compile=True with node_budget=B: every pass is padded to 1 + B nodes, so one graph serves
    the whole run and a second prompt length (the cache's capacity is rounded for compiled runs);
    the tokens are AR's under gumbel and the eager run's under rejection, seed for seed. The
    control: the same count taken over an eager budget run sees no compiled graph at all."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    monkeypatch.setattr(causal_lm, "COMPILE_BACKEND", counter)
    adapter = CausalLMAdapter(lm)

    def run(prompt, **fields):
        config = sp.SamplerConfig(**{"method": "sjd_pac", "window": 16, "node_budget": 24, "cfg_scale": 2.0,
                                     "top_k": 40, "verify": "gumbel", **fields})
        return sp.sample_tokens(adapter, prompt, 60, config=config, seed=4, uncond_prompt_ids=UNCOND)

    eager = run(PROMPT)
    assert counter.frame_count == 0
    envelopes = set()
    for prompt in (PROMPT, torch.cat([PROMPT, PROMPT])):
        ar = run(prompt, method="ar", node_budget=None)
        out = run(prompt, compile=True)
        assert torch.equal(out.tokens, ar.tokens)
        envelopes |= {r.envelope for r in out.stats.records[1:]}
        assert all(r.host_syncs == 1 for r in out.stats.records)
    assert envelopes == {25}
    assert counter.frame_count == 1  # one graph for the budget's one shape, both prompts
    assert torch.equal(run(PROMPT, verify="rejection", compile=True).tokens, run(PROMPT, verify="rejection").tokens)
    torch._dynamo.reset()
    assert eager.stats.forward_passes < 60  # the budget's trees did commit several tokens a pass


@pytest.mark.slow
def test_a_repeated_compiled_run_skips_the_warm_up_passes(lm, monkeypatch):
    """The warm-up runs each compiled pass size once per model, not once per image: a second run
    of the same shapes calls the compiled step exactly once per pass (the first calls it for the
    warm-up too). The control is the first run itself."""
    torch._dynamo.reset()
    monkeypatch.setattr(causal_lm, "COMPILE_BACKEND", "aot_eager")
    adapter = CausalLMAdapter(lm)
    calls = []
    step = adapter.compiled_step
    monkeypatch.setattr(adapter, "compiled_step", lambda *a, **k: calls.append(1) or step(*a, **k))
    config = sp.SamplerConfig(method="sjd_pac", window=8, tree_width=2, verify="gumbel", cfg_scale=2.0, compile=True)
    counts = []
    for _ in range(2):
        calls.clear()
        out = sp.sample_tokens(adapter, PROMPT, 40, config=config, seed=1, uncond_prompt_ids=UNCOND)
        counts.append((len(calls), len(out.stats.records) - 1))  # compiled calls, passes after the prefill
    torch._dynamo.reset()
    (first_calls, first_passes), (second_calls, second_passes) = counts
    assert first_calls == first_passes + 2  # the warm-up's chain and tree envelopes
    assert second_calls == second_passes


@pytest.mark.slow
def test_compiled_auto_window_keeps_to_its_compiled_sizes_and_the_ar_tokens(lm, monkeypatch):
    """window="auto" with compile: every pass is padded to one of the few candidate windows the
    warm-up compiled and timed (before, each new L built a graph, torch.compile hit its limit and
    fell back to eager), the auto window really moves among them, and the tokens are AR's."""
    from torch._dynamo.testing import CompileCounter

    from sjd_pac_core.engine import loop
    from sjd_pac_core.engine.window import COMPILED_CANDIDATE_WINDOWS, AutoWindow, CostCurve

    torch._dynamo.reset()
    counter = CompileCounter()
    monkeypatch.setattr(causal_lm, "COMPILE_BACKEND", counter)
    # The window's choice follows a fixed CPU-like cost curve (each node costs), not this machine's
    # timer: on a loaded machine the measured costs and per-pass overheads made it stay put.
    curve = CostCurve((1, 65), (1.0, 5.0))
    monkeypatch.setattr(loop, "measure_cost_curve", lambda *args, **kwargs: curve)
    monkeypatch.setattr(AutoWindow, "note_overhead", lambda self, seconds: None)
    adapter = CausalLMAdapter(lm)
    ar = sp.sample_tokens(adapter, PROMPT, 120, config=sp.SamplerConfig(method="ar", verify="gumbel", cfg_scale=2.0),
                          seed=3, uncond_prompt_ids=UNCOND)
    config = sp.SamplerConfig(method="sjd_pac", window="auto", tree_width=2, verify="gumbel", cfg_scale=2.0,
                              compile=True)
    out = sp.sample_tokens(adapter, PROMPT, 120, config=config, seed=3, uncond_prompt_ids=UNCOND)
    torch._dynamo.reset()
    side = drafters.make_drafter(config).max_side_nodes
    allowed = {1 + w + extra for w in COMPILED_CANDIDATE_WINDOWS for extra in (0, side)}
    envelopes = [r.envelope for r in out.stats.records[1:]]
    assert set(envelopes) <= allowed
    assert counter.frame_count <= len(allowed)  # one graph per size, none rebuilt
    chosen = {e - 1 - (0 if e - 1 in COMPILED_CANDIDATE_WINDOWS else side) for e in envelopes}
    assert len(chosen) > 1, "the auto window never moved"
    assert torch.equal(out.tokens, ar.tokens)


def test_arrays_to_device_keeps_every_array_its_shape_and_values():
    import numpy as np

    from sjd_pac_core.transfer import arrays_to_device

    arrays = [np.arange(5), np.zeros(0, dtype=np.int32), np.array([[3, 1], [4, 1]], dtype=np.int16), np.array([7])]
    out = arrays_to_device(arrays, torch.device("cpu"))
    assert [t.dtype for t in out] == [torch.long] * 4
    assert [tuple(t.shape) for t in out] == [(5,), (0,), (2, 2), (1,)]
    assert all(np.array_equal(t.numpy(), a) for t, a in zip(out, arrays))
