"""The ComfyUI node pack as plain Python (no ComfyUI here): node definitions, runs on the demo
model, VALIDATE_INPUTS, and the progress / preview / Cancel / free-memory paths through
nodes/comfy_bridge.py, whose hooks are the only seam (tests inject plain callables into it)."""

from __future__ import annotations

import importlib.util
import inspect
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import List

import pytest
import torch
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
DEMO_WEIGHTS = REPO / "sjd_pac_core" / "demo" / "weights" / "config.json"
PACK_NAME = "sjd_pac_comfy_pack"  # the repo root, imported the way ComfyUI imports custom_nodes/sjd-pac

OUR_NODES = ["LoadARImageModel", "SJDPACSampler", "DecodeARImageTokens", "SJDStats", "SJDPACTextToImage"]
SOCKET_TYPES = {"AR_IMAGE_MODEL", "AR_IMAGE_TOKENS", "SJD_STATS", "IMAGE"}
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN"}


def load_pack():
    """Import the repo root's __init__.py as a package (like ComfyUI's load_custom_node)."""
    if PACK_NAME in sys.modules:
        return sys.modules[PACK_NAME]
    spec = importlib.util.spec_from_file_location(
        PACK_NAME, REPO / "__init__.py", submodule_search_locations=[str(REPO)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACK_NAME] = module
    spec.loader.exec_module(module)
    return module


def submodule(name: str):
    load_pack()
    return sys.modules[f"{PACK_NAME}.nodes.{name}"]


@pytest.fixture(scope="session")
def pack():
    return load_pack()


@pytest.fixture(scope="session")
def model_setup(tmp_path_factory, request):
    """(loader choice, model root or None): the bundled demo model once its weights exist, else a
    smoke-trained demo checkpoint placed in a models/autoregressive-like folder."""
    if DEMO_WEIGHTS.is_file():
        return "demo", None
    folder = request.getfixturevalue("smoke_demo_folder")
    root = tmp_path_factory.mktemp("autoregressive")
    (root / "demo-smoke").symlink_to(folder, target_is_directory=True)
    return "demo-smoke", str(root)


@pytest.fixture
def bridge(pack, model_setup):
    """The bridge with the model root injected; every injected hook is removed afterwards."""
    b = submodule("comfy_bridge")
    b.reset_hooks()
    _, root = model_setup
    if root is not None:
        b.hooks.model_roots = lambda: [root]
    yield b
    b.reset_hooks()


@pytest.fixture
def handle(pack, bridge, model_setup):
    choice, _ = model_setup
    (h,) = pack.NODE_CLASS_MAPPINGS["LoadARImageModel"]().load(choice, "auto", "cpu")
    return h


def sampler_args(**overrides) -> dict:
    args = dict(prompt="a red circle top left on a blue background", negative_prompt="", resolution="default",
                seed=3, cfg_scale=3.0, temperature=1.0, top_k=0, top_p=1.0, method="sjd_pac", window=32, tree_depth=3,
                tree_width=4, verify="gumbel", batch_size=1)
    args.update(overrides)
    return args


def one_sentence(message: str) -> bool:
    return isinstance(message, str) and message.endswith(".") and len(re.findall(r"[.;!?] [A-Z]", message)) == 0


# --- import hygiene ------------------------------------------------------------------------------
def test_root_imports_without_comfyui(pack):
    assert sorted(pack.NODE_CLASS_MAPPINGS) == sorted(OUR_NODES)
    assert set(pack.NODE_DISPLAY_NAME_MAPPINGS) == set(OUR_NODES)
    assert (REPO / pack.WEB_DIRECTORY / "sjd_pac.js").is_file()
    assert "folder_paths" not in sys.modules and "comfy.model_management" not in sys.modules
    assert not submodule("comfy_bridge").in_comfyui()
    for path in (REPO / "sjd_pac_core").rglob("*.py"):  # the library never reaches for the nodes
        text = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+(nodes|comfy|folder_paths|server)\b", text, re.M), path


# --- node definitions ----------------------------------------------------------------------------
def _check_input(node: str, name: str, spec) -> None:
    assert isinstance(spec, tuple) and 1 <= len(spec) <= 2, (node, name)
    kind, opts = spec[0], (spec[1] if len(spec) > 1 else {})
    assert opts.get("tooltip"), f"{node}.{name} has no tooltip"
    if isinstance(kind, list):
        assert kind and all(isinstance(c, str) for c in kind), (node, name)
        assert opts.get("default", kind[0]) in kind, (node, name)
        return
    assert kind in WIDGET_TYPES | SOCKET_TYPES, (node, name, kind)
    if kind in ("INT", "FLOAT"):
        lo, hi, default = opts["min"], opts["max"], opts["default"]
        assert lo <= default <= hi, (node, name)
        assert isinstance(default, int if kind == "INT" else float), (node, name)
    if kind == "STRING":
        assert isinstance(opts.get("default", ""), str)


@pytest.mark.parametrize("name", OUR_NODES)
def test_input_types_are_valid_for_comfyui(pack, bridge, name):
    cls = pack.NODE_CLASS_MAPPINGS[name]
    spec = cls.INPUT_TYPES()
    assert set(spec) <= {"required", "optional", "hidden"} and spec["required"]
    for section in ("required", "optional"):
        for inp, s in spec.get(section, {}).items():
            _check_input(name, inp, s)
    assert callable(getattr(cls, cls.FUNCTION))
    assert len(cls.RETURN_TYPES) == len(cls.RETURN_NAMES) == len(cls.OUTPUT_TOOLTIPS)
    assert cls.CATEGORY == "sjd-pac" and cls.DESCRIPTION
    if "unique_id" in spec.get("hidden", {}):
        assert spec["hidden"]["unique_id"] == "UNIQUE_ID"


def test_sampler_seed_and_resolution_widgets(pack, handle):
    req = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"].INPUT_TYPES()["required"]
    assert req["seed"][1]["control_after_generate"] is True
    assert req["prompt"][1]["multiline"] is True
    resolutions = req["resolution"][0]
    assert resolutions[0] == "default" and set(handle.resolutions) <= set(resolutions)


# --- loader --------------------------------------------------------------------------------------
def test_loader_lists_demo_first_and_reuses_the_loaded_model(pack, bridge, model_setup):
    choice, _ = model_setup
    loader_cls = pack.NODE_CLASS_MAPPINGS["LoadARImageModel"]
    choices = loader_cls.INPUT_TYPES()["required"]["model"][0]
    assert choices[0] == "demo" and choice in choices
    (a,) = loader_cls().load(choice, "auto", "cpu")
    (b,) = loader_cls().load(choice, "auto", "cpu")  # a second loader node, same settings: the same model
    assert a.get() is b.get()
    assert a.family == "demo" and "64x64" in a.resolutions
    (c,) = loader_cls().load(choice, "fp32", "cpu")  # other settings: another cache entry
    assert c.key != a.key and c.get() is not a.get()
    assert a.get() is b.get()  # ... and the first one is still there (no last-loader-wins state)


def test_loader_can_check_every_weight_whatever_the_size(pack, bridge, model_setup, monkeypatch):
    """The load-time NaN/inf check runs by default only up to 2e9 parameters; the loader's
    check_finite switch runs it for any size (here the limit is lowered so the demo counts as large)."""
    from sjd_pac_core.models import loader as core_loader

    choice, _ = model_setup
    loader_cls = pack.NODE_CLASS_MAPPINGS["LoadARImageModel"]
    switch = loader_cls.INPUT_TYPES()["optional"]["check_finite"]
    assert switch[0] == "BOOLEAN" and switch[1]["default"] is False and "2e9" in switch[1]["tooltip"]
    checked = []
    original = core_loader.check_finite_weights
    monkeypatch.setattr(core_loader, "check_finite_weights", lambda *args: checked.append(1) or original(*args))
    monkeypatch.setattr(core_loader, "FINITE_CHECK_DEFAULT_LIMIT", 0)
    submodule("model_cache").clear()
    (plain,) = loader_cls().load(choice, "auto", "cpu")
    assert not checked
    (checking,) = loader_cls().load(choice, "auto", "cpu", check_finite=True)
    assert checked == [1] and checking.key != plain.key and checking.check_finite


def test_float_widgets_offer_no_value_the_sampler_refuses_without_a_sentence(pack):
    """Every FLOAT knob's range ends inside the float32 bounds; the tiny values its range still
    holds (a typed 1e-45) are refused by the one validation with one sentence (rows above)."""
    from sjd_pac_core.config import LARGEST_LOGIT_SCALE, SamplerConfig

    req = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"].INPUT_TYPES()["required"]
    assert req["cfg_scale"][1]["max"] <= LARGEST_LOGIT_SCALE
    for name in ("cfg_scale", "temperature", "top_p"):
        spec = req[name][1]
        SamplerConfig(**{name: spec["max"]})  # the top of the range is accepted
        SamplerConfig(**{name: spec["step"]})  # and the smallest step above 0
        assert spec["min"] == -1.0  # below 0 only the "model's own value" sentinel


def test_loader_rejects_missing_model_with_the_fix(pack, bridge):
    loader_cls = pack.NODE_CLASS_MAPPINGS["LoadARImageModel"]
    message = loader_cls.VALIDATE_INPUTS("lumina-mgpt-7b-768")
    assert "models/autoregressive" in message and one_sentence(message)
    assert loader_cls.VALIDATE_INPUTS("demo") is True
    with pytest.raises(ValueError, match="models/autoregressive"):
        loader_cls().load("lumina-mgpt-7b-768", "auto", "cpu")


# --- sampler, decoder, stats ---------------------------------------------------------------------
def test_sampler_decoder_and_stats_with_live_progress(pack, bridge, handle):
    progress, events = [], []
    bridge.hooks.progress = lambda value, total, preview: progress.append((value, total, preview))
    bridge.hooks.event = lambda name, data: events.append((name, data))
    nodes = pack.NODE_CLASS_MAPPINGS
    tokens, stats = nodes["SJDPACSampler"]().sample(handle, **sampler_args(batch_size=2), unique_id="7")

    n = 272
    assert tokens.tokens.shape == (2, n) and tokens.tokens.dtype == torch.long
    assert tokens.resolution == "64x64" and tokens.seeds == [3, 4] and tokens.model is handle
    assert len(stats.runs) == 2 and stats.tokens_committed == 2 * n and stats.method == "sjd_pac"

    values = [v for v, _, _ in progress]  # the bar advances with committed tokens, to the end
    assert values == sorted(values) and values[-1] == 2 * n and {t for _, t, _ in progress} == {2 * n}
    assert len(progress) == stats.forward_passes
    previews = [p for _, _, p in progress if p is not None]
    assert previews and all(isinstance(p, Image.Image) for p in previews)
    assert {name for name, _ in events} == {"sjd_pac.progress"}
    data = [d for _, d in events]
    assert data[0]["reset"] and data[0]["node"] == "7" and data[-1]["done"]
    assert sum(sum(d["accepted"]) for d in data) == 2 * n  # the chart sees every pass
    assert data[-1]["step_compression"] == pytest.approx(stats.runs[-1].step_compression, abs=1e-3)

    (image,) = nodes["DecodeARImageTokens"]().decode(tokens, 0, "nearest")  # 0: the model's own size
    assert image.shape == (2, 64, 64, 3) and image.dtype == torch.float32
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0

    out = nodes["SJDStats"]().report(stats)
    plot, summary = out["result"]
    assert plot.ndim == 4 and plot.shape[0] == 1 and plot.shape[-1] == 3 and plot.dtype == torch.float32
    assert out["ui"]["text"] == [summary] and "tokens per forward pass" in summary and "forward passes" in summary


def test_speedup_against_an_ar_run_of_the_same_job(pack, bridge, handle):
    submodule("speedup").clear()
    nodes = pack.NODE_CLASS_MAPPINGS
    sampler = nodes["SJDPACSampler"]()
    _, pac = sampler.sample(handle, **sampler_args(seed=11))
    before = nodes["SJDStats"]().report(pac)["result"][1]
    assert "no AR run" in before
    ar_tokens, ar = sampler.sample(handle, **sampler_args(seed=11, method="ar"))
    assert ar.forward_passes == 272
    for text in (nodes["SJDStats"]().report(pac)["result"][1],  # from the registry
                 nodes["SJDStats"]().report(pac, ar_baseline=ar)["result"][1]):  # explicit link
        assert "speedup vs AR" in text and "fewer forward passes" in text
        assert "tokens identical to AR (gumbel, seed-exact): yes" in text
    assert torch.equal(ar_tokens.tokens, pac.tokens)
    with pytest.raises(ValueError, match="method is ar"):
        nodes["SJDStats"]().report(ar, ar_baseline=pac)


def test_text_to_image_node(pack, bridge, handle):
    image, stats = pack.NODE_CLASS_MAPPINGS["SJDPACTextToImage"]().generate(handle, "a blue square", 5, "sjd")
    assert image.shape == (1, 512, 512, 3) and image.dtype == torch.float32 and stats.method == "sjd"
    assert stats.config == handle.get().defaults.sampler_config(method="sjd")  # the model's settings


def test_resolution_is_checked_against_the_model_at_run_time(pack, bridge, handle):
    import sjd_pac_core as sp

    calls: List[int] = []
    bridge.hooks.progress = lambda *a: calls.append(1)
    with pytest.raises(sp.ConfigError, match="64x64") as info:
        pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]().sample(handle, **sampler_args(resolution="768x768"))
    assert one_sentence(str(info.value)) and not calls  # failed before any model work


# --- knob checks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, word", [
    (dict(temperature=0.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(window=-2), "window"),
    (dict(cfg_scale=-2.0), "cfg_scale"),
    (dict(batch_size=0), "batch_size"),
    (dict(method="fast"), "method"),
    (dict(verify="exact"), "verify"),
    (dict(tree_depth=9), "D <= 4"),
    (dict(tree_width=0), "tree_width"),
    (dict(temperature=1e-45), "temperature = 1e-45 is below"),  # inside the widget's range
    (dict(top_p=1e-46), "top_p = 1e-46 is below"),  # inside the widget's range
    (dict(cfg_scale=3.5e38), "cfg_scale = 3.5e+38 is above"),
])
def test_bad_knobs_fail_before_model_work_with_the_fix(pack, bridge, handle, bad, word):
    """ComfyUI's own min/max/list check stops most of these at queue time; a host that calls the node
    without it gets one sentence naming the fix from the node itself, before any forward pass."""
    cls = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]
    calls: List[int] = []
    bridge.hooks.progress = lambda *a: calls.append(1)
    import sjd_pac_core as sp

    with pytest.raises(sp.ConfigError) as info:
        cls().sample(handle, **sampler_args(**bad))
    assert word in str(info.value) and one_sentence(str(info.value)) and not calls, str(info.value)


def comfy_validation(cls, inputs: dict) -> list:
    """The rows ComfyUI 0.3.x files for a node's VALIDATE_INPUTS (execution.py, validate_inputs):
    the method gets the inputs it names that the prompt holds (a linked one, [node, slot], as None),
    and a refusal is filed once for every input it got."""
    names = inspect.getfullargspec(cls.VALIDATE_INPUTS).args
    given = {k: (None if isinstance(v, list) else v) for k, v in inputs.items() if k in names}
    result = cls.VALIDATE_INPUTS(**given)
    if result is True:
        return []
    return [{"type": "custom_validation_failed", "message": "Custom validation failed for node",
             "details": f"{name} - {result}", "extra_info": {"input_name": name}} for name in given]


def widget_inputs(**changes) -> dict:
    """The sampler's widget values as a prompt holds them: the shipped defaults (-1 = the model's)."""
    values = dict(sampler_args(), cfg_scale=-1.0, temperature=-1.0, top_k=-1, top_p=-1.0, window=-1, tree_depth=-1,
                  tree_width=-1, seed_control="randomize", compile=False, node_budget=0)
    values.update(changes)
    return values


@pytest.mark.parametrize("bad, words", [
    (dict(temperature=0.0), "temperature must be > 0"),  # inside the widget's range (-1 = the model's)
    (dict(temperature=-0.5), "temperature must be > 0"),
    (dict(top_p=0.0), "top_p must be above 0"),
    (dict(cfg_scale=-0.5), "cfg_scale must be >= 0"),
    (dict(tree_depth=0), "tree_depth (D) must be an integer >= 1"),
    (dict(tree_width=0), "tree_width (K) must be an integer >= 1"),
    (dict(method="fast"), "Unknown method 'fast'"),  # ComfyUI leaves the named inputs' lists to the node
    (dict(node_budget=5000), "1 to 1024 nodes per pass"),  # ...and their ranges
    (dict(method="sjd", node_budget=128), "set the method to sjd_pac"),
    (dict(tree_depth=1, node_budget=128), "tree depth D of 2 or more"),
    (dict(node_budget=-1, compile=True), "compiled run"),
])
def test_input_mistakes_are_refused_by_validation_in_the_run_time_words(pack, bad, words):
    """ComfyUI's validation (VALIDATE_INPUTS) refuses them before anything runs, with the sentence
    the node would raise when run (the one conversion, shared with the CLI and the app)."""
    cls = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]
    rows = comfy_validation(cls, widget_inputs(**bad))
    assert rows and len({r["details"].split(" - ", 1)[1] for r in rows}) == 1
    sentence = rows[0]["details"].split(" - ", 1)[1]
    assert words in sentence and one_sentence(sentence), sentence
    sampler = submodule("sampler")
    with pytest.raises(Exception) as info:  # the same words when the node runs (a host without validation)
        sampler.make_config(*(widget_inputs(**bad)[k] for k in ("method", "window", "tree_depth", "tree_width",
                                                                 "verify", "cfg_scale", "temperature", "top_k",
                                                                 "top_p")),
                            compile=widget_inputs(**bad)["compile"], node_budget=widget_inputs(**bad)["node_budget"])
    assert str(info.value) == sentence


def test_validation_passes_what_runs_linked_inputs_and_old_workflows(pack):
    cls = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]
    assert comfy_validation(cls, widget_inputs()) == []  # the shipped defaults
    for good in (dict(temperature=0.01), dict(top_p=1.0), dict(node_budget=-1), dict(node_budget=128, window=0),
                 dict(tree_depth=4, tree_width=5), dict(top_k=2, tree_width=4), dict(method="ar", tree_width=5)):
        assert comfy_validation(cls, widget_inputs(**good)) == [], good
    assert comfy_validation(cls, widget_inputs(temperature=["7", 0])) == []  # linked: checked when it runs
    old = {k: v for k, v in widget_inputs().items() if k not in ("compile", "node_budget")}
    assert comfy_validation(cls, old) == []  # saved before the optional inputs existed
    text_to_image = pack.NODE_CLASS_MAPPINGS["SJDPACTextToImage"]
    assert comfy_validation(text_to_image, dict(method="sjd_pac", node_budget=-1)) == []
    rows = comfy_validation(text_to_image, dict(method="ar", node_budget=128))
    assert rows and "set the method to sjd_pac" in rows[0]["details"]


def test_validation_names_real_inputs_and_leaves_the_rest_to_comfyui(pack):
    """ComfyUI skips its own range and list check for every input VALIDATE_INPUTS names: each name
    must be an input, and every knob it does not name must hold no value the sampler refuses
    anywhere in its widget range (its ends, 0 and -1)."""
    sampler = submodule("sampler")
    for node in ("SJDPACSampler", "SJDPACTextToImage", "LoadARImageModel"):
        cls = pack.NODE_CLASS_MAPPINGS[node]
        spec = cls.INPUT_TYPES()
        inputs = {**spec["required"], **spec.get("optional", {})}
        named = inspect.getfullargspec(cls.VALIDATE_INPUTS).args[1:]
        assert named and set(named) <= set(inputs), (node, named)
    req = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"].INPUT_TYPES()["required"]
    named = inspect.getfullargspec(pack.NODE_CLASS_MAPPINGS["SJDPACSampler"].VALIDATE_INPUTS).args
    for knob in ("window", "top_k"):
        assert knob not in named
        opts = req[knob][1]
        for value in {opts["min"], opts["max"], 0, -1, 1} & set(range(opts["min"], opts["max"] + 1)):
            assert sampler.widget_problem(**{knob: value}) is None, (knob, value)


def test_the_loader_refuses_quantizing_the_demo_before_loading(pack, bridge, model_setup):
    choice, _ = model_setup
    loader = pack.NODE_CLASS_MAPPINGS["LoadARImageModel"]
    rows = comfy_validation(loader, dict(model=choice, dtype="auto", device="auto", quantize="int8"))
    sentence = rows[0]["details"].split(" - ", 1)[1]
    assert "set quantize to none" in sentence and one_sentence(sentence) and "device_map" not in sentence
    assert comfy_validation(loader, dict(model=choice, dtype="auto", device="auto", quantize="none")) == []
    assert comfy_validation(loader, dict(model=choice, dtype="auto", device="auto", quantize="auto")) == []
    assert comfy_validation(loader, dict(model=choice, dtype="auto", device="auto")) == []  # saved before quantize
    bad = comfy_validation(loader, dict(model=choice, dtype="auto", device="auto", quantize="8bit"))
    assert "quantize must be one of none, int8, 4bit, auto" in bad[0]["details"]


def test_k_above_top_k_runs_and_warns_as_in_the_app_and_the_cli(pack, bridge, handle):
    """One rule on every surface: K above top-k is lossless but wastes nodes, so the node runs it
    and SJD Stats warns, in the words of settings.pointless_setting_warnings."""
    from sjd_pac_core.settings import pointless_setting_warnings

    nodes = pack.NODE_CLASS_MAPPINGS
    _, stats = nodes["SJDPACSampler"]().sample(handle, **sampler_args(top_k=2, tree_width=4, tree_depth=2))
    text = nodes["SJDStats"]().report(stats)["result"][1]
    (warning,) = [w for w in pointless_setting_warnings(stats.config) if "top-k" in w]
    assert f"warning: {warning}" in text and "can never be accepted" in warning
    assert stats.tokens_committed == stats.runs[0].num_tokens


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_a_refusal_shows_once_in_the_front_end(pack, tmp_path):
    """web/sjd_pac_errors.js folds ComfyUI's one row per named input into one row, on the input the
    sentence names; other rows and other nodes' rows stay."""
    import json

    cls = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]
    rows = comfy_validation(cls, widget_inputs(temperature=0.0))
    assert len(rows) > 1  # what ComfyUI sends
    other = {"type": "value_bigger_than_max", "message": "Value 99 bigger than max of 16", "details": "batch_size",
             "extra_info": {"input_name": "batch_size"}}
    payload = {"3": {"class_type": "SJDPACSampler", "errors": rows + [other], "dependent_outputs": ["9"]},
               "4": {"class_type": "KSampler", "errors": rows, "dependent_outputs": ["9"]}}
    script = tmp_path / "t.mjs"
    script.write_text(f'import {{ collapseRefusals }} from "{REPO / "web" / "sjd_pac_errors.js"}";\n'
                      f"console.log(JSON.stringify(collapseRefusals({json.dumps(payload)})));\n")
    out = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    ours = result["3"]["errors"]
    assert len(ours) == 2 and ours[1] == other
    assert ours[0]["details"] == rows[0]["details"].split(" - ", 1)[1]
    assert "temperature must be > 0" in ours[0]["details"]
    assert ours[0]["extra_info"]["input_name"] == "temperature"  # the input the sentence names
    assert len(result["4"]["errors"]) == len(rows)  # another pack's node: untouched


def test_compile_is_an_optional_sampler_switch(pack):
    """Optional, so workflows saved before it still validate; it reaches the SamplerConfig."""
    types = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"].INPUT_TYPES()
    assert "compile" not in types["required"] and types["optional"]["compile"][0] == "BOOLEAN"
    sampler = submodule("sampler")
    assert sampler.make_config("sjd_pac", 32, 3, 4, "rejection", 2.0, 1.0, 0, 1.0, compile=True).compile is True
    assert sampler.make_config("sjd_pac", 32, 3, 4, "rejection", 2.0, 1.0, 0, 1.0).compile is False
    import sjd_pac_core as sp

    with pytest.raises(sp.ConfigError, match="compile must be on or off"):
        sampler.make_config("sjd_pac", 32, 3, 4, "rejection", 2.0, 1.0, 0, 1.0, compile="yes")


@pytest.mark.parametrize("node", ["SJDPACSampler", "SJDPACTextToImage"])
def test_node_budget_is_an_optional_input_at_the_end(pack, node):
    """Optional and last, so workflows saved before it load with it off; 0 is off, -1 'auto',
    a number the nodes per pass (bounded like the CLI's --node-budget: settings.node_budget_value)."""
    from sjd_pac_core.config import MAX_NODE_BUDGET

    types = pack.NODE_CLASS_MAPPINGS[node].INPUT_TYPES()
    assert "node_budget" not in types["required"] and list(types["optional"])[-1] == "node_budget"
    kind, opts = types["optional"]["node_budget"]
    assert kind == "INT" and (opts["default"], opts["min"], opts["max"]) == (0, -1, MAX_NODE_BUDGET)
    assert "128" in opts["tooltip"] and "window 0 (auto)" in opts["tooltip"] and "two rows" in opts["tooltip"]


def test_node_budget_reaches_the_sampler_config(pack):
    import sjd_pac_core as sp

    make = submodule("sampler").make_config
    knobs = ("sjd_pac", 0, 3, 4, "gumbel", 2.0, 1.0, 0, 1.0)
    assert make(*knobs).node_budget is None  # the default: off
    assert make(*knobs, node_budget=0).node_budget is None
    assert make(*knobs, node_budget=-1).node_budget == "auto"
    assert make(*knobs, node_budget=128).node_budget == 128
    for bad, words in ((5000, "1 to 1024 nodes per pass, got 5000"), (-5, "got -5"), (2.5, "whole number")):
        with pytest.raises(sp.ConfigError) as info:
            make(*knobs, node_budget=bad)
        assert words in str(info.value) and one_sentence(str(info.value)), str(info.value)
    with pytest.raises(sp.ConfigError) as info:  # the rule in the UI's words, one sentence
        make("sjd", 0, 3, 4, "gumbel", 2.0, 1.0, 0, 1.0, node_budget=128)
    assert "set the method to sjd_pac" in str(info.value) and one_sentence(str(info.value))
    assert "None" not in str(info.value)  # the UI's words: "the node budget to 0 (off)"


def test_node_budget_runs_and_is_recorded(pack, bridge, handle):
    """A short run within 64 nodes per pass: the config, the saved run record and SJD Stats carry it;
    the one-node Text to Image takes 'auto'."""
    extra: dict = {}
    nodes = pack.NODE_CLASS_MAPPINGS
    _, stats = nodes["SJDPACSampler"]().sample(handle, **sampler_args(window=0, node_budget=64), unique_id="4",
                                               extra_pnginfo=extra)
    assert stats.config.node_budget == 64 and extra["sjd_pac"]["4"]["node_budget"] == 64
    assert "node budget 64" in nodes["SJDStats"]().report(stats)["result"][1]
    events = []
    bridge.hooks.event = lambda name, data: events.append(data)
    _, auto = nodes["SJDPACTextToImage"]().generate(handle, "a blue square", 5, "sjd_pac", node_budget=-1,
                                                    unique_id="5")
    assert auto.config.node_budget == "auto" and auto.tokens_committed == auto.runs[0].num_tokens
    picked = [r.envelope - 1 for r in auto.runs[0].records[1:]]  # what 'auto' chose, pass by pass
    text = nodes["SJDStats"]().report(auto)["result"][1]
    assert f"node budget auto picked {min(picked)}" in text and f"{max(picked)} nodes per pass" in text
    assert events and {e["budget"] for e in events} - {None} <= set(picked) and events[-1]["budget"] == picked[-1]
    assert "node budget" not in nodes["SJDStats"]().report(stats)["result"][1].split("settings:")[1].split("\n", 1)[1]


def test_tree_widgets_cannot_exceed_the_budget(pack):
    from sjd_pac_core.config import MAX_TREE_NODES, SamplerConfig, max_tree_depth, tree_node_count

    req = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"].INPUT_TYPES()["required"]
    depth, width = req["tree_depth"][1], req["tree_width"][1]
    for d in range(1, depth["max"] + 1):
        for k in range(1, width["max"] + 1):
            assert tree_node_count(d, k) <= MAX_TREE_NODES, (d, k)
            SamplerConfig(tree_depth=d, tree_width=k)  # and the engine accepts every one
    assert tree_node_count(depth["max"] + 1, width["max"]) > MAX_TREE_NODES  # the ranges are not needlessly small
    assert "K^(D-1)" in depth["tooltip"] and "K^(D-1)" in width["tooltip"]
    import sjd_pac_core as sp

    with pytest.raises(sp.ConfigError) as info:
        submodule("sampler").make_config("sjd_pac", 32, 8, 4, "rejection", 2.0, 1.0, 0, 1.0)
    assert f"D <= {min(depth['max'], max_tree_depth(4))}" in str(info.value) and one_sentence(str(info.value))


def test_defaults_follow_the_loaded_model_and_tooltips_are_true(pack, bridge, handle):
    req = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"].INPUT_TYPES()["required"]
    model_default = ("cfg_scale", "temperature", "top_k", "top_p", "window", "tree_depth", "tree_width")
    assert all(req[name][1]["default"] == -1 for name in model_default)
    defaults = handle.get().defaults
    assert f"demo {defaults.cfg_scale:g}" in req["cfg_scale"][1]["tooltip"]
    assert "demo 3" not in req["cfg_scale"][1]["tooltip"]
    assert f"demo {defaults.temperature:g}" in req["temperature"][1]["tooltip"]
    assert f"demo {defaults.window}" in req["window"][1]["tooltip"]
    assert f"demo {defaults.tree_depth}," in req["tree_depth"][1]["tooltip"]
    assert f"demo {defaults.tree_width}," in req["tree_width"][1]["tooltip"]
    assert "the fastest" not in req["method"][1]["tooltip"]  # only what measurements show
    args = sampler_args(**{name: -1 for name in model_default})
    _, stats = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]().sample(handle, **args)
    assert stats.config == defaults.sampler_config(method="sjd_pac", verify="gumbel")


def test_sampler_runs_with_the_thread_count_for_the_model(pack, bridge, handle):
    seen = []
    bridge.hooks.progress = lambda *a: seen.append(torch.get_num_threads())
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _, stats = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]().sample(handle, **sampler_args())
        assert torch.get_num_threads() == 2  # restored after the run
    finally:
        torch.set_num_threads(before)
    assert set(seen) == {1} and stats.threads == 1  # the demo is small: one thread
    text = pack.NODE_CLASS_MAPPINGS["SJDStats"]().report(stats)["result"][1]
    assert "1 CPU thread" in text and "tokens per forward pass" in text and "method sjd_pac, window L 32" in text


def test_settings_go_into_the_saved_png_metadata(pack, bridge, handle):
    import json

    extra = {"workflow": {"nodes": []}}  # ComfyUI's extra_pnginfo, which Save Image writes into the PNG
    spec = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"].INPUT_TYPES()
    assert spec["hidden"]["extra_pnginfo"] == "EXTRA_PNGINFO"
    pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]().sample(
        handle, **sampler_args(seed=123, cfg_scale=-1, window=-1), unique_id="9", extra_pnginfo=extra)
    saved = json.loads(json.dumps(extra["sjd_pac"]))["9"]  # plain JSON
    assert saved["prompt"] == "a red circle top left on a blue background" and saved["seed"] == 123
    defaults = handle.get().defaults
    assert saved["cfg_scale"] == defaults.cfg_scale and saved["window"] == defaults.window  # resolved values
    # the one record the CLI and the app write too: the same keys, every knob among them
    from sjd_pac_core.config import SamplerConfig
    from sjd_pac_core.settings import run_record

    assert set(saved) == set(run_record(SamplerConfig(), prompt="", seed=0))
    assert saved["threads"] == 1 and saved["device"] == "cpu" and saved["random_seed"] is False
    pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]().sample(handle, **sampler_args(), unique_id="10",
                                                       extra_pnginfo=extra)
    assert set(extra["sjd_pac"]) == {"9", "10"}  # one entry per sampler of the graph


def test_pointless_window_warns_in_the_stats_text(pack, bridge, handle):
    _, stats = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]().sample(handle, **sampler_args(window=1))
    text = pack.NODE_CLASS_MAPPINGS["SJDStats"]().report(stats)["result"][1]
    warnings = [line for line in text.splitlines() if line.startswith("warning: ")]
    assert any(w.startswith("warning: window L = 1") and "at most 2 tokens per pass" in w for w in warnings), text
    assert "cannot beat" not in text
    _, stats = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]().sample(handle, **sampler_args(window=32))
    assert "warning: window" not in pack.NODE_CLASS_MAPPINGS["SJDStats"]().report(stats)["result"][1]


def test_decode_upscales_the_demo_to_512_by_default(pack, bridge, handle):
    tokens, _ = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]().sample(handle, **sampler_args())
    decode = pack.NODE_CLASS_MAPPINGS["DecodeARImageTokens"]
    req = decode.INPUT_TYPES()["required"]
    assert req["upscale_method"][0] == ["nearest", "lanczos"]
    (image,) = decode().decode(tokens, req["upscale_to"][1]["default"], req["upscale_method"][1]["default"])
    assert image.shape == (1, 512, 512, 3)
    (small,) = decode().decode(tokens, 0, "nearest")
    assert torch.equal(image[:, ::8, ::8], small)  # nearest: every pixel becomes an 8x8 block
    (smooth,) = decode().decode(tokens, 512, "lanczos")
    assert smooth.shape == image.shape and not torch.equal(smooth, image)


def test_every_node_is_found_by_searching_sjd(pack):
    """ComfyUI's node search matches the class name and the display name."""
    for name, display in pack.NODE_DISPLAY_NAME_MAPPINGS.items():
        assert "sjd" in (name + " " + display).lower(), name


def test_web_extension_is_registered_once(pack):
    """ComfyUI registers WEB_DIRECTORY under the folder's name and pyproject's [tool.comfy] web
    under the project's name: both at once load the extension twice when the two names differ."""
    import tomllib

    comfy = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["comfy"]
    registrations = ["web" in comfy, getattr(pack, "WEB_DIRECTORY", None) is not None]
    assert registrations.count(True) == 1
    js = (REPO / "web" / "sjd_pac.js").read_text()
    # The SJD Stats node only grows, and only as far as its summary needs (never past it, never smaller).
    assert js.count("setSize(") == 1 and "needed > node.size[1]" in js


def test_run_time_config_errors_name_the_fix(pack, bridge, handle):
    import sjd_pac_core as sp

    sampler = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]()  # a host that skips validation
    with pytest.raises(sp.ConfigError, match="temperature") as info:
        sampler.sample(handle, **sampler_args(temperature=0.0))
    assert one_sentence(str(info.value))


# --- Cancel, headless, ComfyUI seams -------------------------------------------------------------
class Cancelled(Exception):
    pass


def test_cancel_stops_within_one_forward_pass(pack, bridge, handle):
    passes = []
    bridge.hooks.progress = lambda value, total, preview: passes.append(value)

    def interrupt():
        if len(passes) >= 3:  # the user pressed Cancel during the 4th forward pass
            raise Cancelled()

    bridge.hooks.interrupt = interrupt
    sampler = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]()
    with pytest.raises(Cancelled):
        sampler.sample(handle, **sampler_args(method="ar"))
    assert len(passes) == 3  # no pass after the one during which Cancel came
    bridge.hooks.interrupt = None
    tokens, _ = sampler.sample(handle, **sampler_args(method="sjd"))  # the model is usable again
    assert tokens.tokens.shape == (1, 272)


def test_bridge_is_a_no_op_headless(bridge):
    bridge.check_interrupted()
    bridge.send_event("sjd_pac.progress", {"node": "1"})
    bridge.ProgressSink(10, "1").update(5, Image.new("RGB", (8, 8)))
    bridge.register_model_folder()
    bridge.soft_empty_cache()
    bridge.free_memory_for(1 << 20, "cuda")
    assert bridge.install_free_memory_hook(lambda *a: None) is False
    assert bridge.choose_device("cpu") == "cpu" and bridge.choose_device("auto") == "auto"
    assert bridge.order_workflow_templates("sjd-pac") is False


def test_template_listing_sorts_only_our_pack(bridge):
    listing = {"sjd-pac-main": ["4 - b", "1 - a", "2 - c"], "other-pack": ["z", "a"]}
    out = bridge.sort_template_listing(listing, "sjd-pac-main")
    assert out == {"sjd-pac-main": ["1 - a", "2 - c", "4 - b"], "other-pack": ["z", "a"]}
    assert bridge.sort_template_listing({"other-pack": ["z"]}, "sjd-pac") == {"other-pack": ["z"]}
    assert sorted(p.stem for p in (REPO / "workflows").glob("*.json"))[0].startswith("1 - Demo")


@pytest.fixture
def fake_comfyui(monkeypatch, tmp_path, bridge):
    """Just enough of ComfyUI's module surface for the bridge's own calls (not the sampler's)."""
    state = {"free": 0, "freed": [], "interrupted": False, "bars": [], "sent": []}
    mm = types.ModuleType("comfy.model_management")
    mm.get_torch_device = lambda: torch.device("cpu")  # ComfyUI started with --cpu
    mm.get_free_memory = lambda dev=None: state["free"]
    mm.free_memory = lambda required, device, keep_loaded=(): state["freed"].append((required, str(device)))
    mm.soft_empty_cache = lambda force=False: None

    class InterruptProcessingException(Exception):
        pass

    def throw():
        if state["interrupted"]:
            state["interrupted"] = False
            raise InterruptProcessingException()

    mm.InterruptProcessingException = InterruptProcessingException
    mm.throw_exception_if_processing_interrupted = throw
    fp = types.ModuleType("folder_paths")
    fp.models_dir = str(tmp_path / "models")
    fp.folder_names_and_paths = {"autoregressive": ([str(tmp_path / "extra")], set())}  # from extra_model_paths.yaml

    def add_model_folder_path(name, path, is_default=False):
        paths = fp.folder_names_and_paths.setdefault(name, ([], set()))[0]
        if path not in paths:
            paths.insert(0, path) if is_default else paths.append(path)

    fp.add_model_folder_path = add_model_folder_path
    fp.get_folder_paths = lambda name: list(fp.folder_names_and_paths[name][0])
    utils = types.ModuleType("comfy.utils")

    class ProgressBar:
        def __init__(self, total, node_id=None):
            self.total, self.node_id = total, node_id

        def update_absolute(self, value, total=None, preview=None):
            state["bars"].append((value, total, preview, self.node_id))

    utils.ProgressBar = ProgressBar
    server = types.ModuleType("server")

    class Instance:
        client_id = "client-1"

        def send_sync(self, event, data, sid=None):
            state["sent"].append((event, data, sid))

    server.PromptServer = types.SimpleNamespace(instance=Instance())
    for name, module in {"comfy.model_management": mm, "folder_paths": fp, "comfy.utils": utils, "server": server}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(bridge, "_hook_installed", False)
    return state, mm, fp


def test_two_copies_of_the_pack_still_start_the_server(fake_comfyui, tmp_path, monkeypatch):
    """A git clone `sjd-pac-main` next to a Manager install `sjd-pac`: both folders load (as
    ComfyUI's load_custom_node imports them, under their folder names), each adds its routes to
    the PromptServer's table, and the server starts: aiohttp refuses a second GET (HEAD) route on
    one path, so the route is added once per process. Real aiohttp: its app, router and server."""
    web = pytest.importorskip("aiohttp.web")
    from aiohttp.test_utils import TestClient, TestServer

    routes = web.RouteTableDef()  # PromptServer.instance.routes
    app = web.Application()
    server = types.ModuleType("server")
    server.PromptServer = types.SimpleNamespace(instance=types.SimpleNamespace(routes=routes, app=app))
    monkeypatch.setitem(sys.modules, "server", server)
    custom_nodes = tmp_path / "custom_nodes"
    custom_nodes.mkdir()
    for folder in ("sjd-pac", "sjd-pac-main"):
        (custom_nodes / folder).symlink_to(REPO, target_is_directory=True)
        spec = importlib.util.spec_from_file_location(
            folder, custom_nodes / folder / "__init__.py", submodule_search_locations=[str(custom_nodes / folder)])
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, folder, module)
        spec.loader.exec_module(module)
        assert set(module.NODE_CLASS_MAPPINGS) == set(OUR_NODES)
    ours = [r for r in routes if getattr(r, "path", "").startswith("/sjd_pac/")]
    assert [(r.method, r.path) for r in ours] == [("GET", "/sjd_pac/resolutions")]
    app.add_routes(routes)  # what PromptServer.add_routes does at start-up; raised before

    async def ask() -> dict:
        async with TestClient(TestServer(app)) as client:
            response = await client.get("/sjd_pac/resolutions", params={"model": "janus-pro-7b"})
            assert response.status == 200
            return await response.json()

    import asyncio
    assert asyncio.run(ask())["model"] == "janus-pro-7b"  # answered by the one route


def test_bridge_inside_comfyui(bridge, fake_comfyui, tmp_path):
    state, mm, fp = fake_comfyui
    bridge.reset_hooks()
    assert bridge.in_comfyui()
    bridge.register_model_folder()  # default folder first, the extra_model_paths.yaml entry kept
    assert bridge.model_roots() == [str(tmp_path / "models" / "autoregressive"), str(tmp_path / "extra")]
    assert bridge.choose_device("auto") == "cpu"
    with pytest.raises(ValueError, match="--cpu"):
        bridge.choose_device("gpu")
    bar = bridge.ProgressSink(100, "5")
    bar.update(40, Image.new("RGBA", (8, 8)))
    value, total, preview, node = state["bars"][-1]
    assert (value, total, node) == (40, 100, "5") and preview[0] == "JPEG" and preview[1].mode == "RGB"
    bridge.send_event("sjd_pac.progress", {"node": "5"})
    assert state["sent"] == [("sjd_pac.progress", {"node": "5"}, "client-1")]
    state["interrupted"] = True
    with pytest.raises(mm.InterruptProcessingException):
        bridge.check_interrupted()

    released = []
    original = mm.free_memory
    assert bridge.install_free_memory_hook(lambda dev: released.append(str(dev)))
    assert mm.free_memory is not original and bridge.install_free_memory_hook(lambda *a: None)
    state["free"] = 10
    mm.free_memory(1e30, torch.device("cuda", 0))  # "Unload models": ours must go too
    assert state["freed"] == [(1e30, "cuda:0")] and released == ["cuda:0"]
    released.clear()
    mm.free_memory(5, torch.device("cuda", 0))  # enough memory left: ours stay
    mm.free_memory(1e30, torch.device("cpu"))  # nothing to move off a GPU
    assert released == []


def test_interrupt_exception_from_comfyui_frees_and_propagates(pack, bridge, fake_comfyui, handle):
    state, mm, _ = fake_comfyui
    bridge.reset_hooks()
    bridge.hooks.model_roots = None
    calls = []
    bridge.hooks.progress = lambda *a: (calls.append(1), state.__setitem__("interrupted", len(calls) >= 2))
    with pytest.raises(mm.InterruptProcessingException):
        pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]().sample(handle, **sampler_args(method="ar"))
    assert len(calls) == 2


def test_release_device_unloads_gpu_models_only(pack, bridge, handle):
    cache = submodule("model_cache")
    on_cpu = handle.get()
    assert cache.release_device(torch.device("cuda", 0)) == 0  # our test models live on the CPU
    assert handle.get() is on_cpu  # still loaded

    class OnGPU:  # stands in for a model loaded on a GPU (there is none in CI)
        unloaded = False

        def unload(self):
            self.unloaded = True

    gpu_model, key = OnGPU(), ("/models/x", "auto", "cuda:0")
    with cache._lock:
        cache._models[key] = gpu_model
    assert cache.release_device(torch.device("cuda", 0)) == 1 and gpu_model.unloaded
    assert cache.release_device(torch.device("cuda", 0)) == 0  # it left the cache
    assert handle.get() is on_cpu


# --- web extension -------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_web_chart_logic(tmp_path):
    script = tmp_path / "t.mjs"
    script.write_text(
        f'import {{ applyProgress, chartLabel }} from "{REPO / "web" / "sjd_pac_chart.js"}";\n'
        'let c = applyProgress(null, {reset: true, accepted: [1, 5], passes: 2, committed: 6, num_tokens: 272,'
        ' method: "sjd_pac", image: 0, batch_size: 1, step_compression: 3, done: false});\n'
        'c = applyProgress(c, {accepted: [10], passes: 3, committed: 16, num_tokens: 272, step_compression: 5.33,'
        ' done: true, image: 0, batch_size: 1});\n'
        'console.log(JSON.stringify({a: c.accepted, c: c.compression, done: c.done, label: chartLabel(c)}));\n'
        'c = applyProgress(c, {reset: true, accepted: [1, 4], passes: 2, committed: 5, num_tokens: 272, budget: 48});\n'
        'console.log(JSON.stringify({auto: chartLabel(c)}));\n'
    )
    out = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert '"a":[1,5,10]' in out.stdout and '"c":[1,3,5.333333333333333]' in out.stdout
    assert '"done":true' in out.stdout and "16/272 tokens" in out.stdout
    assert "16/272 tokens · 5.33x · done" in out.stdout.splitlines()[0]  # no budget said without one
    assert "auto budget 48" in out.stdout.splitlines()[1]  # node_budget auto: what the last pass picked
    check = subprocess.run(["node", "--check", str(REPO / "web" / "sjd_pac.js")], capture_output=True, timeout=30)
    assert check.returncode == 0, check.stderr


# --- the resolution list the web extension shows (web/sjd_pac_sizes.js) ------------------------
def _config_folders(root: Path) -> None:
    """Checkpoint folders as the family detection sees them (config.json and the name only)."""
    import json

    for name, model_type in (("lumina-mgpt-7b-768", "chameleon"), ("emu3-gen", "emu3"), ("janus-pro-7b", "janus"),
                             ("gpt2-text", "gpt2")):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps({"model_type": model_type}))


def test_resolution_list_of_each_family_without_loading_it(pack, bridge, model_setup, tmp_path):
    from sjd_pac_core.models import sizes

    _config_folders(tmp_path)
    demo_choice, demo_root = model_setup
    bridge.hooks.model_roots = lambda: [str(tmp_path)] + ([demo_root] if demo_root else [])
    lookup = submodule("loader").resolutions_for_choice
    static = submodule("sampler").RESOLUTIONS
    lumina = lookup("lumina-mgpt-7b-768")
    assert lumina["family"] == "lumina_mgpt" and lumina["resolutions"][0] == "768x768"
    assert lumina["resolutions"] == [f"{w}x{h}" for w, h in sizes.trained_sizes(768)]
    assert {"1024x576", "576x1024"} <= set(lumina["resolutions"]) and "512x512" not in lumina["resolutions"]
    assert lookup("emu3-gen") == {"model": "emu3-gen", "family": "emu3", "resolutions": list(sizes.EMU3_RESOLUTIONS)}
    assert lookup("janus-pro-7b")["resolutions"] == ["384x384"]
    assert lookup(demo_choice)["resolutions"] == ["64x64"]
    for answer in (lumina, lookup("emu3-gen"), lookup("janus-pro-7b")):  # all in ComfyUI's static list
        assert set(answer["resolutions"]) <= set(static)
    for bad in ("not-there", "gpt2-text"):  # the list stays whole; running names the problem
        answer = lookup(bad)
        assert "resolutions" not in answer and one_sentence(answer["error"]), answer


def test_resolutions_route_is_added_only_inside_comfyui(pack, bridge, model_setup, tmp_path, monkeypatch):
    import asyncio

    _config_folders(tmp_path)
    bridge.hooks.model_roots = lambda: [str(tmp_path)]
    lookup = submodule("loader").resolutions_for_choice
    assert bridge.register_routes(lookup) is False  # plain Python: nothing to register with
    added = {}

    class Routes(list):
        def get(self, path):
            def add(handler):
                added[path] = handler
                return handler
            return add

    server = types.ModuleType("server")
    server.PromptServer = types.SimpleNamespace(instance=types.SimpleNamespace(routes=Routes()))
    web = types.ModuleType("aiohttp.web")
    web.json_response = lambda data: ("json", data)
    aiohttp = types.ModuleType("aiohttp")
    aiohttp.web = web
    for name, module in (("server", server), ("aiohttp", aiohttp), ("aiohttp.web", web),
                         ("folder_paths", types.ModuleType("folder_paths")),
                         ("comfy.model_management", types.ModuleType("comfy.model_management"))):
        monkeypatch.setitem(sys.modules, name, module)
    assert bridge.register_routes(lookup) is True
    handler = added[bridge.RESOLUTIONS_ROUTE]
    request = types.SimpleNamespace(rel_url=types.SimpleNamespace(query={"model": "janus-pro-7b"}))
    assert asyncio.run(handler(request)) == ("json", {"model": "janus-pro-7b", "family": "janus",
                                                      "resolutions": ["384x384"]})


def test_a_second_copy_of_the_pack_names_both_copies_and_the_fix(pack, bridge, monkeypatch, caplog):
    """A git clone next to a Manager install: the second copy to load finds the route served (ComfyUI
    would not start if it added it again) and says, as a warning, which copies are there and what to do."""
    def first_handler(request):
        return None

    first_handler.__module__ = "sjd-pac.nodes.comfy_bridge"  # as ComfyUI imports custom_nodes/sjd-pac
    served = [types.SimpleNamespace(path=bridge.RESOLUTIONS_ROUTE, handler=first_handler)]
    server = types.ModuleType("server")
    server.PromptServer = types.SimpleNamespace(instance=types.SimpleNamespace(routes=served))
    for name, module in (("server", server), ("folder_paths", types.ModuleType("folder_paths")),
                         ("comfy.model_management", types.ModuleType("comfy.model_management"))):
        monkeypatch.setitem(sys.modules, name, module)  # as inside ComfyUI
    monkeypatch.setattr(bridge, "copy_folder", lambda f: "sjd-pac-main" if f is not first_handler
                        else "sjd-pac")
    caplog.set_level("WARNING", logger="sjd_pac.nodes")
    assert bridge.register_routes(lambda choice: {}) is True and len(served) == 1  # nothing added twice
    (message,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "custom_nodes/sjd-pac and custom_nodes/sjd-pac-main" in message and "delete the other folder" in message
    assert message.count(". ") == 0 and message.endswith("restart ComfyUI.")


@pytest.mark.parametrize("module, folder", [
    ("/work/comfyui/custom_nodes/sjd-pac-main.nodes.comfy_bridge", "sjd-pac-main"),  # ComfyUI 0.3.64
    ("C:\\ComfyUI\\custom_nodes\\sjd-pac.v2.nodes.comfy_bridge", "sjd-pac.v2"),
    ("sjd-pac-main.nodes.comfy_bridge", "sjd-pac-main"),
                                            ("custom_nodes.sjd-pac.nodes.comfy_bridge", "sjd-pac"),
                                            ("nodes.comfy_bridge", ""), ("", "")])
def test_copy_folder_reads_the_module_comfyui_imported(bridge, module, folder):
    def handler():
        return None

    handler.__module__ = module
    assert bridge.copy_folder(handler) == folder


# ComfyUI's node search (front end 1.27.10, the one ComfyUI 0.3.64 pins) matches the query's words
# fuzzily against the class name and the display name, with Fuse.js's defaults (location 0,
# distance 100, threshold 0.3): an exact word is found only within the first 30 characters of a
# name. Newer front ends also search SEARCH_ALIASES. Checked in the real front end in Chromium.
SEARCH_ROWS = [
    ("speculative", {"SJDPACSampler", "SJDPACTextToImage", "SJDStats"}),
    ("fast sampler", {"SJDPACSampler"}),
    ("lumina", {"LoadARImageModel"}),
    ("janus", {"LoadARImageModel"}),
    ("emu3", {"LoadARImageModel"}),
    ("sjd", set(OUR_NODES)),
]


def front_end_finds(query: str, name: str, display_name: str) -> bool:
    """Every word of the query starts within the first 30 characters of the class or display name."""
    def within(text: str, word: str) -> bool:
        at = text.lower().find(word)
        return 0 <= at <= 30
    words = query.lower().split()
    return any(all(within(text, w) for w in words) for text in (name, display_name))


@pytest.mark.parametrize("query, expected", SEARCH_ROWS, ids=[q for q, _ in SEARCH_ROWS])
def test_search_words_find_the_nodes(pack, query, expected):
    found = {name for name in OUR_NODES
             if front_end_finds(query, name, pack.NODE_DISPLAY_NAME_MAPPINGS[name])}
    assert expected <= found, (query, found)
    if query != "sjd":  # newer front ends: the aliases name the same nodes
        aliased = {name for name in OUR_NODES
                   if any(query in alias.lower() for alias in pack.NODE_CLASS_MAPPINGS[name].SEARCH_ALIASES)}
        assert expected <= aliased, (query, aliased)


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_stats_summary_is_laid_out_whole(pack, bridge, handle, tmp_path):
    """The SJD Stats widget's layout (web/sjd_pac_chart.js) keeps every line of a real summary with a
    warning and an AR baseline, at the width of a fresh node and of the workflows' node: nothing is
    cut, the wall time and speedup lines are there, and the height fits them all."""
    import json as _json

    sampler, stats_node = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"](), pack.NODE_CLASS_MAPPINGS["SJDStats"]()
    _, ar = sampler.sample(handle, **sampler_args(method="ar"))
    _, stats = sampler.sample(handle, **sampler_args(window=1))
    text = stats_node.report(stats, ar_baseline=ar)["ui"]["text"][0]
    assert text.startswith("warning: window L = 1") and "speedup vs AR" in text and "wall time" in text
    script = tmp_path / "layout.mjs"
    script.write_text(
        f'import {{ summaryLayout, SUMMARY_LINE_HEIGHT }} from "{REPO / "web" / "sjd_pac_chart.js"}";\n'
        f'const text = {_json.dumps(text)};\n'
        'const out = [246, 440].map(w => { const l = summaryLayout(text, w, 6.7);'
        ' return {w, lines: l.lines, height: l.height, per: SUMMARY_LINE_HEIGHT}; });\n'
        'console.log(JSON.stringify(out));\n')
    out = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    words = text.split()
    for layout in _json.loads(out.stdout):
        lines = layout["lines"]
        assert " ".join(" ".join(lines).split()) == " ".join(words)  # every word, in order, none cut
        assert all(len(line) * 6.7 <= layout["w"] - 20 or " " not in line for line in lines)
        assert layout["height"] == len(lines) * layout["per"] + 8
        assert any(line.startswith("wall time") for line in lines) and any("speedup vs AR" in line for line in lines)
        assert not any(line.endswith("...") for line in lines)


def test_loader_node_loads_lumina_mgpt2_with_its_sizes(pack, bridge, tmp_path, tiny_lumina_sizes):
    """A Lumina-mGPT 2.0 folder (tiny, in its authors' layout, MoVQGAN file beside config.json) is
    listed, loads through the loader node and answers its sizes; the real sizes are in the
    sampler's static list."""
    from sjd_pac_core.models import sizes
    from tiny_checkpoints import build_lumina2

    build_lumina2(tmp_path / "lumina-mgpt-2.0")
    bridge.hooks.model_roots = lambda: [str(tmp_path)]
    loader_cls = pack.NODE_CLASS_MAPPINGS["LoadARImageModel"]
    assert "lumina-mgpt-2.0" in loader_cls.INPUT_TYPES()["required"]["model"][0]
    (handle_,) = loader_cls().load("lumina-mgpt-2.0", "fp32", "cpu")
    assert handle_.family == "lumina_mgpt2" and handle_.resolutions[0] == "96x96"
    answer = submodule("loader").resolutions_for_choice("lumina-mgpt-2.0")
    assert answer["family"] == "lumina_mgpt2" and answer["resolutions"][0] == "96x96"
    real = sizes.family_resolutions()["lumina_mgpt2"]
    assert real[0] == "768x768" and set(real) <= set(submodule("sampler").RESOLUTIONS)
