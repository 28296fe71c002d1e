"""workflows/*.json: only our nodes and a few ComfyUI core nodes, links between matching types,
widget values that match each node's inputs; the API-format demo runs through the node classes."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch

from test_nodes import REPO, bridge, handle, load_pack, model_setup, pack  # noqa: F401 (fixtures)

WORKFLOWS = REPO / "workflows"
UI_FILES = sorted(WORKFLOWS.glob("*.json"))
API_FILE = WORKFLOWS / "api" / "demo_text_to_image.json"

# ComfyUI core nodes the workflows may use: their sockets and widgets (name, type or choices).
CORE_NODES: Dict[str, Dict[str, Any]] = {
    "SaveImage": {"inputs": {"images": "IMAGE"}, "outputs": [], "widgets": [("filename_prefix", "STRING")]},
    "PreviewImage": {"inputs": {"images": "IMAGE"}, "outputs": [], "widgets": []},
    "Note": {"inputs": {}, "outputs": [], "widgets": [("text", "STRING")]},  # front-end only
}
CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize"}  # seed's control_after_generate widget
# The file name is the title ComfyUI's template browser shows (front end 1.27: title = name, the
# thumbnail is <name>.jpg beside it); the leading number gives the order.
DEMO_WF = "1 - Demo - text to image on the CPU.json"
COMPARE_WF = "2 - Compare AR, SJD and SJD-PAC (demo, identical images).json"
MODEL_FOLDERS = {  # the folder names the docs tell people to use under models/autoregressive
    DEMO_WF: "demo",
    COMPARE_WF: "demo",
    "3 - Lumina-mGPT 7B 768px (needs download and 20 GB GPU).json": "lumina-mgpt-7b-768",
    "4 - Emu3-Gen (needs download and 24 GB GPU).json": "emu3-gen",
    "5 - Janus-Pro 7B 384px (needs download and 16 GB GPU).json": "janus-pro-7b",
    "6 - Lumina-mGPT 2.0 768px (needs download and 24 GB GPU).json": "lumina-mgpt-2.0",
}
MAX_GRAPH_HEIGHT = 1200  # px at zoom 1: readable without scrolling through a tall graph


def node_spec(type_: str) -> Tuple[Dict[str, str], List[str], List[Tuple[str, Any, dict]]]:
    """(socket inputs {name: type}, output types, widgets [(name, type or choices, options)])."""
    if type_ in CORE_NODES:
        core = CORE_NODES[type_]
        return core["inputs"], core["outputs"], [(n, t, {}) for n, t in core["widgets"]]
    cls = load_pack().NODE_CLASS_MAPPINGS[type_]
    spec = cls.INPUT_TYPES()
    sockets, widgets = {}, []
    for section in ("required", "optional"):
        for name, s in spec.get(section, {}).items():
            kind, opts = s[0], (s[1] if len(s) > 1 else {})
            if isinstance(kind, str) and kind not in ("INT", "FLOAT", "STRING", "BOOLEAN"):
                sockets[name] = kind
                continue
            widgets.append((name, kind, opts))
            if opts.get("control_after_generate"):
                widgets.append((name + "_control", sorted(CONTROL_VALUES), {}))
    return sockets, list(cls.RETURN_TYPES), widgets


def fewest_widget_values(type_: str) -> int:
    """How many widget values a saved node must hold: every widget up to the last required one.
    Optional widgets come last, so a workflow saved before one was added still loads (ComfyUI
    assigns widget values by position and leaves the missing tail at its defaults)."""
    if type_ in CORE_NODES:
        return len(CORE_NODES[type_]["widgets"])
    _, _, widgets = node_spec(type_)
    required = load_pack().NODE_CLASS_MAPPINGS[type_].INPUT_TYPES()["required"]
    owners = [name[: -len("_control")] if name.endswith("_control") else name for name, _, _ in widgets]
    return max((i + 1 for i, owner in enumerate(owners) if owner in required), default=0)


def check_value(where: str, name: str, kind: Any, opts: dict, value: Any) -> None:
    if name == "model" and isinstance(kind, list):  # the loader's list depends on what is installed
        assert isinstance(value, str) and value, where
        return
    if isinstance(kind, list):
        assert value in kind, f"{where}: {name}={value!r} not in {kind}"
    elif kind == "INT":
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: {name}={value!r}"
        assert opts.get("min", value) <= value <= opts.get("max", value), f"{where}: {name}={value} out of range"
    elif kind == "FLOAT":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: {name}={value!r}"
        assert opts.get("min", value) <= value <= opts.get("max", value), f"{where}: {name}={value} out of range"
    elif kind == "STRING":
        assert isinstance(value, str), f"{where}: {name}={value!r}"
    elif kind == "BOOLEAN":
        assert isinstance(value, bool), f"{where}: {name}={value!r}"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_expected_workflows_exist():
    assert {p.name for p in UI_FILES} == set(MODEL_FOLDERS)
    assert API_FILE.is_file()


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.name)
def test_ui_workflow_is_valid(path, pack):
    wf = load(path)
    assert wf["version"] == 0.4 and isinstance(wf["nodes"], list) and isinstance(wf["links"], list)
    nodes = {n["id"]: n for n in wf["nodes"]}
    assert len(nodes) == len(wf["nodes"]) and wf["last_node_id"] >= max(nodes)
    known = set(pack.NODE_CLASS_MAPPINGS) | set(CORE_NODES)
    for n in wf["nodes"]:
        assert n["type"] in known, f"{path.name}: unknown node type {n['type']}"
        for key in ("pos", "size", "widgets_values"):
            assert key in n, f"{path.name}: node {n['id']} lacks {key}"
        sockets, outputs, widgets = node_spec(n["type"])
        where = f"{path.name} node {n['id']} ({n['type']})"
        assert fewest_widget_values(n["type"]) <= len(n["widgets_values"]) <= len(widgets), f"{where}: widget count"
        for (name, kind, opts), value in zip(widgets, n["widgets_values"]):
            check_value(where, name, kind, opts, value)
        for inp in n.get("inputs", []):
            assert sockets.get(inp["name"]) == inp["type"], f"{where}: input {inp['name']}"
        linked = {inp["name"] for inp in n.get("inputs", []) if inp.get("link") is not None}
        required = n["type"] in pack.NODE_CLASS_MAPPINGS and pack.NODE_CLASS_MAPPINGS[n["type"]].INPUT_TYPES()["required"]
        for name in sockets:
            if required and name in required:
                assert name in linked, f"{where}: required input {name} is not connected"
        for slot, out in enumerate(n.get("outputs", [])):
            assert out["type"] == outputs[slot], f"{where}: output {slot}"

    link_ids = set()
    for link_id, src, src_slot, dst, dst_slot, type_ in wf["links"]:
        link_ids.add(link_id)
        a, b = nodes[src], nodes[dst]
        assert a["outputs"][src_slot]["type"] == type_, f"{path.name}: link {link_id} source type"
        assert link_id in a["outputs"][src_slot]["links"]
        assert b["inputs"][dst_slot]["type"] == type_ and b["inputs"][dst_slot]["link"] == link_id
    assert len(link_ids) == len(wf["links"]) and wf["last_link_id"] >= max(link_ids)

    loaders = [n for n in wf["nodes"] if n["type"] == "LoadARImageModel"]
    assert loaders and {n["widgets_values"][0] for n in loaders} == {MODEL_FOLDERS[path.name]}


def test_workflows_saved_before_the_optional_widgets_still_load(pack):
    """The optional widgets sit after every required one: a saved node may stop before them (the
    shipped workflows predate node_budget), never before a required one."""
    sampler_widgets = [name for name, _, _ in node_spec("SJDPACSampler")[2]]
    assert sampler_widgets[-2:] == ["compile", "node_budget"]
    assert fewest_widget_values("SJDPACSampler") == len(sampler_widgets) - 2 == 15
    assert [name for name, _, _ in node_spec("SJDPACTextToImage")[2]][-1] == "node_budget"
    assert fewest_widget_values("SJDPACTextToImage") == 6 and fewest_widget_values("LoadARImageModel") == 3
    saved = [n for n in load(WORKFLOWS / DEMO_WF)["nodes"] if n["type"] == "SJDPACSampler"]
    assert saved and all(len(n["widgets_values"]) < len(sampler_widgets) for n in saved)  # the old files


def test_comparison_workflow_uses_one_seed_and_gumbel(pack):
    wf = load(WORKFLOWS / COMPARE_WF)
    _, _, widgets = node_spec("SJDPACSampler")
    names = [w[0] for w in widgets]
    samplers = [dict(zip(names, n["widgets_values"])) for n in wf["nodes"] if n["type"] == "SJDPACSampler"]
    assert sorted(s["method"] for s in samplers) == ["ar", "sjd", "sjd_pac"]
    for key in ("prompt", "seed", "cfg_scale", "temperature", "top_k", "top_p", "resolution", "batch_size"):
        assert len({s[key] for s in samplers}) == 1, key
    assert {s["verify"] for s in samplers} == {"gumbel"} and {s["seed_control"] for s in samplers} == {"fixed"}
    notes = " ".join(n["widgets_values"][0] for n in wf["nodes"] if n["type"] == "Note")
    assert "gumbel" in notes and "identical" in notes
    stats = [n for n in wf["nodes"] if n["type"] == "SJDStats"]
    assert sum(1 for n in stats for i in n["inputs"] if i["name"] == "ar_baseline" and i["link"]) == 2


def _api_inputs(pack) -> dict:
    api = load(API_FILE)
    for node_id, node in api.items():
        cls = node["class_type"]
        assert cls in pack.NODE_CLASS_MAPPINGS or cls in CORE_NODES, cls
        sockets, _, widgets = node_spec(cls)
        required = set(pack.NODE_CLASS_MAPPINGS[cls].INPUT_TYPES()["required"]) if cls in pack.NODE_CLASS_MAPPINGS \
            else {name for name, _ in CORE_NODES[cls]["widgets"]}
        for name, kind, opts in widgets:
            if name.endswith("_control") or (name not in required and name not in node["inputs"]):
                continue  # an optional input left out runs with its default, as in ComfyUI
            assert name in node["inputs"], f"API node {node_id}: {name} missing"
            check_value(f"API node {node_id}", name, kind, opts, node["inputs"][name])
        for name, type_ in sockets.items():
            if name not in node["inputs"]:
                continue
            src, slot = node["inputs"][name]
            _, outputs, _ = node_spec(api[src]["class_type"])
            assert outputs[slot] == type_, f"API node {node_id}: {name} gets {outputs[slot]}"
    return api


def test_api_workflow_matches_the_ui_demo(pack):
    api = _api_inputs(pack)
    ui = load(WORKFLOWS / DEMO_WF)
    for n in ui["nodes"]:
        if n["type"] == "Note":
            continue
        node = api[str(n["id"])]
        assert node["class_type"] == n["type"]
        _, _, widgets = node_spec(n["type"])
        for (name, _, _), value in zip(widgets, n["widgets_values"]):
            if not name.endswith("_control"):
                assert node["inputs"][name] == value, (n["id"], name)


def test_api_demo_workflow_runs_through_the_nodes(pack, bridge, model_setup):  # noqa: F811
    """A tiny executor (topological order, like ComfyUI) over the API workflow, on the demo model."""
    api = _api_inputs(pack)
    choice, _ = model_setup
    results: Dict[str, tuple] = {}

    def run(node_id: str) -> tuple:
        if node_id in results:
            return results[node_id]
        node = api[node_id]
        kwargs = {}
        for name, value in node["inputs"].items():
            kwargs[name] = run(value[0])[value[1]] if isinstance(value, list) else value
        if node["class_type"] == "LoadARImageModel":
            kwargs["model"] = choice  # "demo", or the smoke checkpoint until the demo weights land
        if node["class_type"] in ("SaveImage", "PreviewImage"):
            results[node_id] = (kwargs["images"],)
            return results[node_id]
        cls = pack.NODE_CLASS_MAPPINGS[node["class_type"]]
        if hasattr(cls, "VALIDATE_INPUTS"):  # as ComfyUI does: only the arguments it names
            names = inspect.signature(cls.VALIDATE_INPUTS).parameters
            assert cls.VALIDATE_INPUTS(**{k: v for k, v in kwargs.items() if k in names}) is True
        out = getattr(cls(), cls.FUNCTION)(**kwargs)
        results[node_id] = out["result"] if isinstance(out, dict) else out
        return results[node_id]

    for node_id in api:
        run(node_id)
    saved = [results[i][0] for i, n in api.items() if n["class_type"] == "SaveImage"]
    assert saved and saved[0].shape == (1, 512, 512, 3) and saved[0].dtype == torch.float32  # upscaled x8
    plot = [results[i][0] for i, n in api.items() if n["class_type"] == "PreviewImage"]
    assert plot and plot[0].ndim == 4


def _widgets(node: dict) -> dict:
    _, _, widgets = node_spec(node["type"])
    return dict(zip([w[0] for w in widgets], node["widgets_values"]))


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.name)
def test_seeds_randomize_except_in_the_comparison(path, pack):
    samplers = [_widgets(n) for n in load(path)["nodes"] if n["type"] == "SJDPACSampler"]
    want = "fixed" if path.name == COMPARE_WF else "randomize"  # the comparison needs one seed
    assert samplers and {s["seed_control"] for s in samplers} == {want}


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.name)
def test_knobs_take_the_model_defaults_and_decode_upscales(path, pack):
    wf = load(path)
    for s in (_widgets(n) for n in wf["nodes"] if n["type"] == "SJDPACSampler"):
        for key in ("cfg_scale", "temperature", "top_k", "top_p", "window", "tree_depth", "tree_width"):
            assert s[key] == -1, (path.name, key)
    decoders = [_widgets(n) for n in wf["nodes"] if n["type"] == "DecodeARImageTokens"]
    want = 512 if MODEL_FOLDERS[path.name] == "demo" else 0  # the demo's 64 px becomes 512 px
    assert decoders and {d["upscale_to"] for d in decoders} == {want}


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.name)
def test_template_browser_thumbnail_title_and_size(path):
    from PIL import Image

    thumb = path.with_suffix(".jpg")
    assert thumb.is_file(), f"{path.name}: no thumbnail {thumb.name}"
    with Image.open(thumb) as im:
        assert im.format == "JPEG" and min(im.size) >= 256
    assert not set(path.stem) & set("/\\?#%&+"), "the name goes into a URL"
    if MODEL_FOLDERS[path.name] != "demo":
        assert "needs download" in path.stem and "GB GPU" in path.stem
    wf = load(path)
    top = min(n["pos"][1] for n in wf["nodes"])
    bottom = max(n["pos"][1] + n["size"][1] for n in wf["nodes"])
    assert bottom - top <= MAX_GRAPH_HEIGHT, f"{path.name} is {bottom - top} px tall"


def test_template_order_demo_then_comparison_then_real_families():
    names = sorted(p.name for p in UI_FILES)
    assert [n.split(" - ")[0] for n in names] == ["1", "2", "3", "4", "5", "6"]
    assert names[0] == DEMO_WF and names[1] == COMPARE_WF
    assert all(MODEL_FOLDERS[n] != "demo" for n in names[2:])
    assert not (WORKFLOWS / "index.json").exists()  # ComfyUI 0.3.64 would list it as a template


def test_demo_note_lists_the_known_words():
    words = json.loads((REPO / "sjd_pac_core" / "demo" / "weights" / "vocab.json").read_text())
    words = words["words"] if isinstance(words, dict) else words
    text = " ".join(n["widgets_values"][0] for n in load(WORKFLOWS / DEMO_WF)["nodes"] if n["type"] == "Note")
    content = [w for w in words if len(w) > 3]  # colours, shapes, positions
    assert all(w in text for w in content if w not in ("background",)), [w for w in content if w not in text]
    assert "textures" not in text and "6-10 s per image" in text  # measured in ComfyUI 0.3.64 --cpu


TITLE_BAR = 30  # px ComfyUI draws above a node's pos
SCREEN = (1920, 1080)


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.name)
def test_workflow_fits_a_screen_readably_without_overlaps(path):
    """Fitted to a 1920 x 1080 screen, the graph keeps at least 85% of its size (text stays readable);
    no node (title bar included) covers another."""
    nodes = load(path)["nodes"]
    boxes = [(n["pos"][0], n["pos"][1] - TITLE_BAR, n["pos"][0] + n["size"][0], n["pos"][1] + n["size"][1])
             for n in nodes]
    width = max(b[2] for b in boxes) - min(b[0] for b in boxes)
    height = max(b[3] for b in boxes) - min(b[1] for b in boxes)
    assert min(SCREEN[0] / width, SCREEN[1] / height) >= 0.85, f"{path.name}: {width} x {height} px"
    for i, a in enumerate(boxes):
        for j, b in enumerate(boxes[:i]):
            overlap = a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
            assert not overlap, f"{path.name}: node {nodes[i]['id']} covers node {nodes[j]['id']}"


# ComfyUI's front end opens a workflow at the view saved in it (extra.ds, with the setting "save
# and restore canvas position and zoom level", on by default): a node at graph position p is drawn
# at (p + offset) * scale on the canvas, with its title bar (TITLE_BAR px) above p. The canvas fills
# the window, but the menu bar lies over its top edge and the side bar over its left edge.
WINDOW = (1600, 1000)  # a laptop's browser window
MENU_BAR, SIDE_BAR = 45, 50  # px of the canvas they cover, at the top and on the left


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.name)
def test_workflow_opens_whole_in_a_1600_by_1000_window(path):
    """Every node, title bar included, lies in the part of a 1600 x 1000 canvas that the menu and
    side bars leave free, at the view the workflow opens with: nothing to scroll to or zoom out for
    (the demo was 1,820 px wide, the comparison 2,240 px, with Save Image cut off)."""
    wf = load(path)
    view = wf["extra"]["ds"]
    scale, (dx, dy) = view["scale"], view["offset"]
    assert scale >= 0.7, f"{path.name}: opens at {scale:.0%}, too small to read"
    for n in wf["nodes"]:
        (x, y), (w, h) = n["pos"], n["size"]
        left, top = (x + dx) * scale, (y - TITLE_BAR + dy) * scale
        right, bottom = (x + w + dx) * scale, (y + h + dy) * scale
        assert left >= SIDE_BAR and top >= MENU_BAR, f"{path.name}: node {n['id']} ({n['type']}) under the bars"
        assert right <= WINDOW[0] and bottom <= WINDOW[1], (
            f"{path.name}: node {n['id']} ({n['type']}) ends at ({right:.0f}, {bottom:.0f}), outside {WINDOW}")


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.name)
def test_real_families_ship_the_recommended_gpu_budget(path, pack):
    """The real families run on a GPU, where a pass of up to ~128 nodes costs about one token's: their
    samplers ship node budget 128 (with the model's L, 64), as the docs recommend; the demo runs on a
    CPU, where every node costs, without one (and its file keeps the shape saved before the budget)."""
    samplers = [_widgets(n) for n in load(path)["nodes"] if n["type"] == "SJDPACSampler"]
    if MODEL_FOLDERS[path.name] == "demo":
        assert all(s.get("node_budget", 0) == 0 for s in samplers)
        return
    assert samplers and {s["node_budget"] for s in samplers} == {128} and {s["method"] for s in samplers} == {"sjd_pac"}
    notes = " ".join(n["widgets_values"][0] for n in load(path)["nodes"] if n["type"] == "Note")
    assert "node_budget 128" in notes and "set it to 0" in notes


def test_comparison_nodes_say_which_method_they_show(pack):
    wf = load(WORKFLOWS / COMPARE_WF)
    _, _, widgets = node_spec("SJDPACSampler")
    names = [w[0] for w in widgets]
    label = {"ar": "AR", "sjd": "SJD", "sjd_pac": "SJD-PAC"}
    for n in wf["nodes"]:
        if n["type"] == "SJDPACSampler":
            method = dict(zip(names, n["widgets_values"]))["method"]
            assert n["title"].split(" ")[0] == label[method], n["title"]
    titles = [n.get("title") for n in wf["nodes"] if n["type"] != "Note" and n["type"] != "LoadARImageModel"]
    assert all(titles) and len(set(titles)) == len(titles), titles
