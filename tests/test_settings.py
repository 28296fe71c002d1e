"""The shared settings conversion (CLI, nodes, app), the tree work budget and the thread rule."""

from __future__ import annotations

import re

import pytest
import torch

import sjd_pac_core as sp
from sjd_pac_core.config import MAX_TREE_NODES, max_tree_depth, tree_node_count
from sjd_pac_core.models.image_model import FamilyDefaults
from sjd_pac_core.sampling import seeds
from sjd_pac_core.settings import LABELS, config_from_settings, flag, seed_value, whole_number
from sjd_pac_core.threads import threads_for, torch_threads

DEMO_LIKE = FamilyDefaults(resolutions=("64x64",), sampler=dict(cfg_scale=2.0, temperature=0.8, window=32))


def test_empty_settings_take_the_family_defaults():
    config = config_from_settings(DEMO_LIKE, window="", cfg_scale=None)
    assert (config.window, config.cfg_scale, config.temperature) == (32, 2.0, 0.8)


def test_ui_conventions():
    config = config_from_settings(DEMO_LIKE, window="auto", top_k=0, top_p=1.0, tree_depth=3.0, cfg_scale="1.5")
    assert config.window == "auto" and config.top_k is None and config.top_p is None
    assert config.tree_depth == 3 and isinstance(config.tree_depth, int) and config.cfg_scale == 1.5


def test_compile_switch_reaches_the_config_from_every_front_end_spelling():
    assert config_from_settings(DEMO_LIKE).compile is False
    assert config_from_settings(DEMO_LIKE, compile="").compile is False  # empty: the default
    for on, off in [(True, False), ("true", "false"), (1, 0), ("ON", "off")]:
        assert config_from_settings(DEMO_LIKE, compile=on).compile is True
        assert config_from_settings(DEMO_LIKE, compile=off).compile is False


@pytest.mark.parametrize("field, value", [
    ("window", 2.5), ("tree_depth", "x"), ("cfg_scale", float("nan")), ("temperature", float("inf")), ("top_k", 1.5),
    ("window", True), ("compile", "maybe"), ("compile", 2), ("tree_side_chain", "long"), ("tree_chain_width", 1.5),
])
def test_bad_settings_name_the_field(field, value):
    """A refused setting is named by its label, the one human name of the knob."""
    with pytest.raises(sp.ConfigError, match=re.escape(LABELS[field])):
        config_from_settings(DEMO_LIKE, **{field: value})


def test_every_knob_has_one_label_and_one_flag():
    """The label table covers exactly SamplerConfig's fields; flags are the field names with dashes."""
    import dataclasses

    assert set(LABELS) == {f.name for f in dataclasses.fields(sp.SamplerConfig)}
    assert len(set(LABELS.values())) == len(LABELS)
    assert flag("tree_side_chain") == "--tree-side-chain" and flag("cfg_scale") == "--cfg-scale"


# With the default first level of 8 candidates (then K): 8 + 8K + 8K^2 + ...
@pytest.mark.parametrize("width, depth", [(1, 33), (2, 6), (3, 4), (4, 4), (8, 3), (16, 3)])
def test_largest_tree_depth_fits_the_budget_and_one_more_does_not(width, depth):
    assert max_tree_depth(width) == depth
    assert tree_node_count(depth, width) <= MAX_TREE_NODES
    assert tree_node_count(depth + 1, width) > MAX_TREE_NODES


@pytest.mark.parametrize("width, depth", [(1, 64), (2, 8), (3, 5), (4, 4), (8, 3), (16, 2)])
def test_budget_with_uniform_widths(width, depth):
    assert max_tree_depth(width, first_width=None) == depth
    assert tree_node_count(depth, width, first_width=None) <= MAX_TREE_NODES
    if depth < 64:
        assert tree_node_count(depth + 1, width, first_width=None) > MAX_TREE_NODES


def test_a_huge_tree_is_refused_at_once_with_the_largest_depth():
    with pytest.raises(sp.ConfigError, match=r"with K = 4 use D <= 4"):
        sp.SamplerConfig(method="sjd_pac", tree_depth=8, tree_width=4)
    with pytest.raises(sp.ConfigError, match=r"K = 2 use D <= 6"):
        sp.SamplerConfig(method="sjd_pac", tree_depth=10**9, tree_width=2)  # counted, not built
    # The tree knobs do not matter (and are not checked) where no tree is built.
    assert sp.SamplerConfig(method="sjd", tree_depth=8, tree_width=4).use_pd is False
    with pytest.raises(sp.ConfigError, match="window"):
        sp.SamplerConfig(window=10**6)
    # The first level's width counts: 300 candidates there alone are over the budget.
    with pytest.raises(sp.ConfigError, match=r"first level 300"):
        sp.SamplerConfig(tree_depth=2, tree_width=4, tree_first_width=300)
    assert sp.SamplerConfig(tree_depth=2, tree_width=4, tree_first_width=256, tree_side_chain=0).tree_side_nodes == 255
    assert config_from_settings(DEMO_LIKE, tree_side_chain="4").tree_side_chain == 4
    assert config_from_settings(DEMO_LIKE, tree_chain_width="3").tree_chain_width == 3
    assert config_from_settings(DEMO_LIKE).tree_chain_width == 1  # off unless asked for
    with pytest.raises(sp.ConfigError, match=r"chain width must be a whole number.*try 3"):
        config_from_settings(DEMO_LIKE, tree_chain_width="wide")


def test_one_meaning_of_every_seed_value():
    """None and -1 draw a fresh seed (below 2^32, returned); 0..2^64-1 are themselves; anything
    else is refused with one sentence (sampling/seeds.py, used by every front end)."""
    assert seeds.resolve_seed(7) == 7 and seeds.resolve_seed(0) == 0 and seeds.resolve_seed(2**64 - 1) == 2**64 - 1
    for random_value in (None, -1):
        assert seeds.check_seed(random_value) is None
        drawn = {seeds.resolve_seed(random_value) for _ in range(8)}
        assert len(drawn) > 1 and all(0 <= s < 2**32 for s in drawn)
    for bad in (-2, 2**64, 1.5, "3", True):
        with pytest.raises(sp.ConfigError, match="seed") as err:
            seeds.check_seed(bad)
        assert str(err.value).count(". ") == 0 and str(err.value).endswith(".")
    # a batch counts on from its seed, modulo 2^64: every seed in range starts a batch of any size
    assert [seeds.image_seed(5, i) for i in range(3)] == [5, 6, 7]
    assert seeds.image_seed(2**64 - 1, 1) == 0


def test_ui_seed_values():
    """The fields' text and whole floats are read as numbers; an empty field is a random seed."""
    assert seed_value("7") == 7 and seed_value(3.0) == 3 and seed_value("18446744073709551615") == 2**64 - 1
    assert seed_value("") is None and seed_value(None) is None and seed_value("-1") is None
    assert whole_number(2**70, "x", "1") == 2**70
    for bad in (-2, 2**64, 1.5, "abc"):
        with pytest.raises(sp.ConfigError, match="seed"):
            seed_value(bad)


def test_thread_rule_and_restore():
    small = torch.nn.Linear(10, 10)
    assert threads_for(small, torch.device("cpu")) == 1
    assert threads_for(small, torch.device("meta")) is None
    big = torch.nn.Embedding(40_000_000, 1, device="meta")
    assert threads_for(big, torch.device("cpu")) is None
    before = torch.get_num_threads()
    with torch_threads(2) as used:
        assert used == torch.get_num_threads() == 2
    assert torch.get_num_threads() == before


def test_run_record_carries_every_knob():
    import dataclasses

    from sjd_pac_core.settings import run_record

    record = run_record(sp.SamplerConfig(tree_first_width=6), prompt="a red circle", seed=5)
    names = {f.name for f in dataclasses.fields(sp.SamplerConfig)}
    assert names <= set(record) and record["cfg_scale"] == 1.0 and record["tree_first_width"] == 6


def test_tree_first_width_setting_and_cli_flag():
    """The first level's width: a whole number, 0 = K at every level (one conversion for the
    CLI, the nodes and the app)."""
    from sjd_pac_core import cli

    assert config_from_settings(DEMO_LIKE, tree_first_width="16").tree_first_width == 16
    assert config_from_settings(DEMO_LIKE, tree_first_width=0).tree.widths == (4, 4)
    assert config_from_settings(DEMO_LIKE).tree_first_width == 8
    with pytest.raises(sp.ConfigError, match="first"):
        config_from_settings(DEMO_LIKE, tree_first_width="2.5")
    with pytest.raises(sp.ConfigError, match="0 .K at every level. or more"):
        config_from_settings(DEMO_LIKE, tree_first_width=-3)
    args = cli.build_parser().parse_args(["generate", "a red circle", "-D", "2", "-K", "4", "--tree-first-width", "0"])
    assert cli._config_from_args(args, DEMO_LIKE).tree.widths == (4,)


@pytest.mark.parametrize("field,value,fix", [("top_k", -2, "top_k must be 0 (off) or more"),
                                             ("top_p", 0, "top_p must be above 0"),
                                             ("top_p", "-0.5", "top_p must be above 0")])
def test_impossible_top_k_and_top_p_name_the_ui_values(field, value, fix):
    """The message names what a widget or flag can enter (0 / 1 = off), not SamplerConfig's None."""
    with pytest.raises(sp.ConfigError, match=re.escape(fix)) as err:
        config_from_settings(DEMO_LIKE, **{field: value})
    assert "None" not in str(err.value)


@pytest.mark.parametrize("knobs", [dict(method="sjd"), dict(method="ar"), dict(method="sjd_pac", tree_depth=1),
                                   dict(method="sjd_pac", proactive_drafting=False)])
def test_a_node_budget_without_a_tree_names_the_ui_fix(knobs):
    """A budget needs Proactive Drafting's tree: the message says what a widget or flag can set
    (the node budget to 0), not SamplerConfig's node_budget=None."""
    with pytest.raises(sp.ConfigError, match=re.escape("or the node budget to 0 (off)")) as err:
        config_from_settings(DEMO_LIKE, node_budget=128, **knobs)
    assert "None" not in str(err.value)
    assert config_from_settings(DEMO_LIKE, node_budget=0, **knobs).node_budget is None
    assert config_from_settings(DEMO_LIKE, node_budget=128, method="sjd_pac").node_budget == 128


# --- a node budget without a window takes the window it needs -----------------------------------

def demo_defaults():
    from sjd_pac_core.models.demo import DemoImageModel

    return DemoImageModel.defaults


def test_the_demo_window_would_cap_a_budget():
    """Why the rule below matters: the demo's own window is far below a budget's main chain."""
    assert isinstance(demo_defaults().window, int) and demo_defaults().window < 64


@pytest.mark.parametrize("budget", [128, "auto", "64"])
def test_a_budget_without_a_window_takes_the_auto_window(budget):
    defaults = demo_defaults()
    assert config_from_settings(defaults, node_budget=budget).window == "auto"
    assert config_from_settings(defaults, node_budget=budget, window="").window == "auto"
    assert config_from_settings(defaults, node_budget=budget, window=12).window == 12  # a window given is kept
    assert config_from_settings(defaults, node_budget=budget, window="auto").window == "auto"
    assert config_from_settings(defaults, node_budget=0).window == defaults.window  # no budget: the model's own
    assert config_from_settings(defaults).window == defaults.window
    # the tree's chain width needs a fixed window, but a budget ignores the tree knobs
    assert config_from_settings(defaults, node_budget=budget, tree_chain_width=3).window == "auto"
    with pytest.raises(sp.ConfigError, match="needs a fixed window"):
        config_from_settings(defaults, window="auto", tree_chain_width=3)


def test_every_front_end_gives_a_budget_the_auto_window():
    """The CLI, the nodes, the app and a batch line all go through the one conversion."""
    from test_nodes import submodule

    from sjd_pac_app.runner import run_settings
    from sjd_pac_core import cli
    from sjd_pac_core.batch.jobs import line_config

    defaults = demo_defaults()
    parse = cli.build_parser().parse_args
    assert cli._config_from_args(parse(["generate", "a red circle", "--node-budget", "128"]), defaults).window == "auto"
    assert cli._config_from_args(parse(["generate", "a red circle", "--node-budget", "128", "-L", "12"]),
                                 defaults).window == 12
    assert cli._config_from_args(parse(["generate", "a red circle"]), defaults).window == defaults.window
    make = submodule("sampler").make_config
    knobs = ("sjd_pac", -1, -1, -1, "gumbel", -1, -1, -1, -1)  # -1: the model's own (window too)
    assert make(*knobs, defaults=defaults, node_budget=128).window == "auto"
    assert make(*knobs, defaults=defaults, node_budget=-1).window == "auto"  # budget 'auto'
    assert make(*knobs, defaults=defaults).window == defaults.window
    page = dict(prompt="a red circle", negative_prompt="", resolution=None, seed=0, method="sjd_pac",
                verify="gumbel", cfg_scale=2.0, temperature=0.8, top_k=0, top_p=1.0, tree_depth=2, tree_width=4)
    assert run_settings(defaults, **page, window="", node_budget="128").config.window == "auto"
    assert run_settings(defaults, **page, window="12", node_budget="128").config.window == 12
    assert line_config(defaults, {"node_budget": 128}).window == "auto"
    assert line_config(defaults, {"node_budget": 128, "window": 32}).window == 32


def test_a_budget_alone_under_rejection_gives_its_picture_again(demo_model, monkeypatch):
    """The auto window a fixed budget takes times nothing: two devices with opposite pass costs
    (as tests/test_window.py plants them) draw the same tokens for a seed under rejection."""
    from sjd_pac_core.engine import loop
    from sjd_pac_core.engine.window import CostCurve
    from sjd_pac_core.settings import seed_reproduces_picture

    config = config_from_settings(demo_defaults(), verify="rejection", node_budget=64)
    assert config.window == "auto" and seed_reproduces_picture(config)
    prompt, tokens, probes = "a large orange circle top right on a blue background", [], []
    for costs in (CostCurve((1, 128), (1.0, 1.0)), CostCurve((1, 128), (1.0, 128.0))):
        monkeypatch.setattr(loop, "measure_cost_curve", lambda *a, _c=costs, **k: probes.append(1) or _c)
        tokens.append(sp.generate_image(demo_model, prompt, config, seed=3).tokens)
    assert torch.equal(tokens[0], tokens[1]) and not probes


# --- generate_image's CPU threads: the CLI's choice, the caller's setting restored ----------------

def test_generate_image_runs_with_the_clis_thread_choice_and_restores_the_callers(demo_model):
    seen = []

    def record(progress):
        seen.append(torch.get_num_threads())

    def record_and_stop(progress):
        record(progress)
        raise sp.GenerationCancelled()

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)  # the caller's own setting, not the demo's choice (1)
        sp.generate_image(demo_model, "a red circle top left on a blue background", seed=0, callback=record)
        assert set(seen) == {threads_for(demo_model)} == {1} and torch.get_num_threads() == 3
        for threads, during in ((2, 2), (None, 3), ("auto", 1)):
            seen.clear()
            with pytest.raises(sp.GenerationCancelled):  # restored when the run raises too
                sp.generate_image(demo_model, "a red circle top left on a blue background", seed=0, callback=record_and_stop, threads=threads)
            assert seen == [during] and torch.get_num_threads() == 3, threads
        for bad in (0, -1, "2", 1.5, True):
            with pytest.raises(sp.ConfigError, match="threads must be 'auto', None"):
                sp.generate_image(demo_model, "a red circle top left on a blue background", seed=0, threads=bad)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


# --- what L = 1 does, said truly -----------------------------------------------------------------

@pytest.mark.parametrize("knobs, says, never", [
    (dict(method="sjd", window=1), ["sjd commits at most 2 tokens per pass"], ["tree", "cannot beat"]),
    (dict(method="sjd_pac", window=1, tree_depth=1), ["at most 2 tokens per pass"], ["tree", "cannot beat"]),
    (dict(method="sjd_pac", window=1, tree_depth=2, tree_width=4, tree_first_width=None),
     ["at most 2 tokens per pass", "tree's 4 candidates raise the chance"], ["unused", "cannot beat"]),
    (dict(method="sjd_pac", window=1, tree_depth=3, tree_width=4),
     ["tree's 8 candidates", "levels past the first (D = 3) go unused"], ["cannot beat"]),
])
def test_window_one_warning_says_what_l1_does(knobs, says, never):
    from sjd_pac_core.settings import pointless_setting_warnings

    (note,) = pointless_setting_warnings(sp.SamplerConfig(**knobs))
    assert note.count(".") <= 2 and note.endswith("or the auto window for more.")  # one sentence
    for phrase in says:
        assert phrase in note, note
    for phrase in never:
        assert phrase not in note, note


def test_window_one_claims_hold_on_the_demo_model(demo_model):
    """The sentence's numbers are the sampler's: at L = 1 no pass commits more than 2 tokens, and
    the tree makes SJD-PAC take fewer passes than SJD (counts, not times)."""
    import sjd_pac_core as sp

    passes = {}
    for method, depth in (("sjd", 1), ("sjd_pac", 2)):
        config = demo_model.defaults.sampler_config(method=method, window=1, tree_depth=depth)
        stats = sp.generate_image(demo_model, "a red circle on a blue background", config, seed=0).stats
        assert max(stats.accept_lengths[1:]) <= 2 and stats.forward_passes < stats.num_tokens
        passes[method] = stats.forward_passes
    assert passes["sjd_pac"] < passes["sjd"]


@pytest.mark.parametrize("fields,reproduces", [
    (dict(verify="gumbel", window="auto"), True),
    (dict(verify="gumbel", window=32), True),
    (dict(verify="rejection", window=32), True),
    (dict(verify="rejection", window="auto"), False),
    (dict(verify="rejection", window="auto", method="ar"), True),  # AR has no window to choose
    (dict(verify="rejection", node_budget="auto"), False),  # the pass size follows the measured speed
    (dict(verify="rejection", node_budget=128), True),
    (dict(verify="rejection", node_budget=128, window="auto"), True),  # what a budget alone gets: nothing timed
    (dict(verify="rejection", node_budget="auto", window="auto"), False),
    (dict(verify="gumbel", node_budget="auto"), True),
])
def test_what_a_seed_reproduces_is_said_in_the_run_record(fields, reproduces):
    """Only the rejection rule with the auto window (whose windows follow the measured speed)
    reproduces just the distribution from a seed (tests/test_window.py shows both halves)."""
    from sjd_pac_core.settings import run_record, seed_note, seed_reproduces_picture

    config = sp.SamplerConfig(**fields)
    assert seed_reproduces_picture(config) is reproduces
    record = run_record(config, prompt="a red circle", seed=5)
    assert record["seed_reproduces"] == ("picture" if reproduces else "distribution")
    note = seed_note(config)
    assert (note is None) is reproduces
    if note:
        assert "reproduces the distribution of pictures, not this picture" in note and "gumbel" in note


# --- tree candidates beyond top-k: one warning on every surface ---------------------------------

@pytest.mark.parametrize("knobs, fix", [
    (dict(top_k=2, tree_first_width=None), "use tree width K <= 2 or a top-k of at least 4 (0 = off)"),
    (dict(top_k=4), "use tree first width <= 4 or a top-k of at least 8 (0 = off)"),  # K fits, the first level not
    (dict(top_k=2), "use tree width K <= 2 and tree first width <= 2 or a top-k of at least 8"),
])
def test_tree_candidates_beyond_top_k_are_a_warning_with_the_fix(knobs, fix):
    """The run is exact (the sampler marks such candidates), so the CLI, the nodes and the app all
    run it and say so in one sentence; a setting that fits top-k, has no tree or a node budget
    (which does not use K) says nothing."""
    from sjd_pac_core.settings import pointless_setting_warnings

    config = sp.SamplerConfig(method="sjd_pac", **knobs)
    (note,) = pointless_setting_warnings(config)
    assert fix in note and "can never be accepted" in note and note.count(". ") == 0, note
    for fine in (dict(top_k=8), dict(top_k=None), dict(top_k=2, node_budget=64), dict(top_k=2, method="sjd"),
                 dict(top_k=2, tree_depth=1)):
        assert pointless_setting_warnings(config.with_(**fine)) == [], fine


def test_the_auto_budget_says_what_it_picked():
    from sjd_pac_core.settings import auto_budget_line

    auto = sp.SamplerConfig(node_budget="auto")
    assert auto_budget_line(auto, [0, 49, 49]) == "node budget auto picked 48 nodes per pass"
    assert auto_budget_line(auto, [0, 33, 49, 49, 65]) == ("node budget auto picked 32 to 64 nodes per pass, "
                                                          "48 on most passes")
    assert auto_budget_line(auto, [0]) is None  # nothing picked yet
    assert auto_budget_line(sp.SamplerConfig(node_budget=64), [0, 65]) is None  # a fixed budget is in the settings line
