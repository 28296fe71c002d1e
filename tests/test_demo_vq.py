"""The demo VQ tokenizer and token layout, with the shipped weights."""

import json
import os

import numpy as np
import pytest
import torch

from sjd_pac_core.demo import WEIGHTS_DIR
from sjd_pac_core.demo import captions as C
from sjd_pac_core.demo.captions import SLOT_NAMES, PromptError, parse_prompt
from sjd_pac_core.demo.tools import data as D
from sjd_pac_core.demo.vocab import BOI, BOS, EOL, PAD, SLOT_WORDS, SPECIALS, DemoVocab
from sjd_pac_core.demo.vq import VQConfig, VQModel

HAVE_WEIGHTS = os.path.exists(os.path.join(WEIGHTS_DIR, "vq.safetensors"))
needs_weights = pytest.mark.skipif(not HAVE_WEIGHTS, reason="demo weights not built")


@pytest.fixture(scope="module")
def vq():
    return VQModel.from_pretrained(WEIGHTS_DIR)


@pytest.fixture(scope="module")
def vocab():
    return DemoVocab.load(WEIGHTS_DIR)


def test_untrained_round_trip_shapes():
    torch.manual_seed(0)
    m = VQModel(VQConfig(codebook_size=64)).eval()
    ims, _ = D.generate(2, seed=0)
    codes = m.encode(ims)
    assert codes.shape == (2, 16, 16) and codes.dtype == torch.long
    assert int(codes.min()) >= 0 and int(codes.max()) < 64
    rec = m.decode(codes)
    assert rec.shape == (2, 3, 64, 64)
    assert m.decode_to_uint8(codes).shape == (2, 64, 64, 3)


@needs_weights
def test_shipped_config_and_codebook(vq):
    with open(os.path.join(WEIGHTS_DIR, "vq_config.json")) as f:
        cfg = json.load(f)
    assert cfg["codebook_size"] == vq.codebook_size
    assert 256 <= vq.codebook_size <= 512
    assert vq.quantizer.embedding.shape == (vq.codebook_size, cfg["code_dim"])
    assert vq.quantizer.embedding.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in vq.parameters())  # upcast for CPU
    assert torch.isfinite(vq.quantizer.embedding).all()


@needs_weights
def test_shipped_reconstruction_error(vq):
    ims, _ = D.generate(8, seed=11, split="heldout")
    codes = vq.encode(ims)
    assert codes.shape == (8, 16, 16)
    rec = vq.decode_to_uint8(codes)
    assert rec.shape == ims.shape and rec.dtype == np.uint8
    mse = ((rec.astype(np.float64) - ims) ** 2).mean()
    psnr = 10 * np.log10(255.0**2 / mse)
    assert psnr > 22.0, psnr
    # the codes are used broadly, not collapsed onto a few entries
    assert len(torch.unique(codes)) > 100
    # re-encoding the reconstruction gives mostly the same codes (a stable tokenizer)
    again = vq.encode(rec)
    assert (again == codes).float().mean() > 0.5


@needs_weights
def test_shipped_vocab_layout(vocab, vq):
    assert vocab.specials == SPECIALS and SPECIALS[:5] == ["<pad>", "<bos>", "<boi>", "<eol>", "<eoi>"]
    assert vocab.codebook_size == vq.codebook_size
    assert vocab.row_token_offset == len(SPECIALS) + len(vocab.words)
    assert vocab.image_offset == vocab.row_token_offset + (vocab.grid if vocab.row_tokens else 0)
    assert vocab.vocab_size == vocab.image_offset + vocab.codebook_size
    assert set(C.CAPTION_WORDS) <= set(vocab.words)
    p = vocab.prompt_ids("a red circle top left on a blue background")
    if vocab.prompt_format == "slots":  # <bos>, the structured caption's 11 slots, <boi>
        assert p[0] == BOS and p[-1] == BOI and len(p) == len(SLOT_NAMES) + 2 == vocab.prompt_length
        assert vocab.decode_ids(p[1:-1]).split() == ["top", "left", "medium", "red", "circle"] + ["<pad>"] * 5 + ["blue"]
        assert vocab.uncond_prompt_ids().tolist() == [BOS] + [PAD] * len(SLOT_NAMES) + [BOI]
    else:
        assert p[0] == BOS and p[-1] == BOI and len(p) == 11
        assert vocab.uncond_prompt_ids().tolist() == [BOS, BOI]
    codes = torch.randint(0, vocab.codebook_size, (3, 16, 16))
    ids = vocab.image_ids(codes)
    assert ids.shape == (3, 16 * 17)
    row_ends = vocab.row_end_ids()
    assert (ids[:, 16::17] == row_ends).all()
    assert torch.equal(vocab.codes_from_ids(ids), codes)
    allowed = vocab.allowed_tokens()
    assert allowed.shape == (272, vocab.vocab_size)
    assert allowed[16].sum() == 1 and allowed[16, row_ends[0]] and allowed[16 + 17 * 15, row_ends[15]]
    assert allowed[0].sum() == vocab.codebook_size and not allowed[0, : vocab.image_offset].any()
    forced = vocab.forced_tokens()
    assert torch.equal(forced[16::17], row_ends) and (forced.reshape(16, 17)[:, :16] == -1).all()


def test_row_tokens_name_each_row_and_round_trip(tmp_path):
    """`row_tokens`: row r ends in its own forced token <eol r>, between the words and the codes;
    the layout round-trips, a wrong row end is refused, and the setting survives vocab.json
    (a vocab.json written before the option loads as the shared <eol>)."""
    words = list(C.CAPTION_WORDS)
    shared, rows = DemoVocab(words=words), DemoVocab(words=words, row_tokens=True)
    assert rows.image_offset == shared.image_offset + 16 and rows.vocab_size == shared.vocab_size + 16
    assert torch.equal(shared.row_end_ids(), torch.full((16,), EOL))
    assert rows.row_end_ids().tolist() == list(range(shared.image_offset, shared.image_offset + 16))
    codes = torch.randint(0, rows.codebook_size, (2, 16, 16))
    ids = rows.image_ids(codes)
    assert ids[0, 16::17].tolist() == rows.row_end_ids().tolist()
    assert torch.equal(rows.codes_from_ids(ids), codes)
    assert rows.decode_ids(ids[0, 16:17]) == "<eol0>" and rows.decode_ids(ids[0, -1:]) == "<eol15>"
    swapped = ids.clone()
    swapped[:, [16, 33]] = swapped[:, [33, 16]]
    with pytest.raises(ValueError, match="row-end"):
        rows.codes_from_ids(swapped)
    rows.save(str(tmp_path))
    assert DemoVocab.load(str(tmp_path)).row_tokens is True
    legacy = json.loads((tmp_path / "vocab.json").read_text())
    del legacy["row_tokens"]
    legacy["image_offset"] = shared.image_offset
    (tmp_path / "vocab.json").write_text(json.dumps(legacy))
    assert DemoVocab.load(str(tmp_path)).row_tokens is False


def test_image_layout_refuses_row_ends_that_do_not_match_the_rows():
    from sjd_pac_core.models.image_model import ImageLayout

    layout = ImageLayout(rows=3, cols=2, row_end=(7, 8, 9), tail=(5,))
    assert layout.forced_tokens().tolist() == [-1, -1, 7, -1, -1, 8, -1, -1, 9, 5]
    with pytest.raises(ValueError, match="2 ids for 3 rows"):
        ImageLayout(rows=3, cols=2, row_end=(7, 8))


def test_smoke_training_output_loads(smoke_demo_folder):
    """`python -m sjd_pac_core.demo.tools.train --smoke` writes a complete, loadable demo folder."""
    from sjd_pac_core.demo.model import load_demo

    for name in ("config.json", "model.safetensors", "vocab.json", "vq.safetensors", "vq_config.json",
                 "training_log.json", "loss_log.jsonl"):
        assert (smoke_demo_folder / name).exists(), name
    log = json.loads((smoke_demo_folder / "training_log.json").read_text())
    assert log["status"] == "complete" and log["lm"]["steps_done"] == log["lm"]["steps"]
    for key in ("seed", "wall_time_s", "cpu_time_s", "torch", "transformers"):
        assert key in log
    demo = load_demo(str(smoke_demo_folder))
    assert next(demo.model.parameters()).dtype == torch.float32
    p = demo.prompt_ids("a red circle top left on a blue background")
    logits = demo.model(input_ids=p[None]).logits
    assert logits.shape == (1, len(p), demo.vocab.vocab_size)
    assert torch.isfinite(logits).all()


def test_smoke_training_with_the_layout_loss_writes_a_plain_model(tmp_path):
    """`demo.tools.train --layout-weight` trains its auxiliary head alongside the LM and saves only the
    LM: the folder loads as a demo model and its log names the weight."""
    import subprocess
    import sys

    from sjd_pac_core.demo.model import load_demo

    subprocess.run([sys.executable, "-m", "sjd_pac_core.demo.tools.train", "--smoke", "--layout-weight", "2", "--out",
                    str(tmp_path), "--no-progress"], check=True, capture_output=True,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert log["status"] == "complete" and log["lm"]["layout_weight"] == 2.0
    demo = load_demo(str(tmp_path))
    assert not any("layout" in name for name in demo.model.state_dict())


def test_lm_stop_at_stops_inside_the_schedule(tmp_path):
    """`--lm-stop-at` (a checkpoint inside the schedule, as the 2,400-step weights of 2026-12-02
    were rebuilt): the LM stops at that step, the log says "stopped" and records the texture, and
    the folder loads; a step outside the schedule is refused."""
    from sjd_pac_core.demo.tools import train
    from sjd_pac_core.demo.model import load_demo

    train.main(["--smoke", "--lm-stop-at", "3", "--out", str(tmp_path), "--no-progress"])
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert log["texture"] == "strong" and log["status"] == "stopped"
    assert log["lm"]["steps_done"] == 3 and log["lm"]["steps"] == 4
    load_demo(str(tmp_path))
    with pytest.raises(SystemExit):
        train.main(["--smoke", "--lm-stop-at", "0", "--out", str(tmp_path / "x"), "--no-progress"])


def test_object_loss_weights_layout_and_weighted_loss():
    """Loss weights follow the image sequence (16 rows of 16 codes + <eol>, then <eoi>): tokens
    in a caption region get 1 + object_weight, <eol>/<eoi> and the rest 1, a dropped caption
    uniform weights; the weighted loss with equal weights is the plain cross entropy."""
    from sjd_pac_core.demo.tools.train import make_batch, object_loss_weights, weighted_lm_loss

    regions = np.zeros((2, 16, 16), np.float32)
    regions[0, 2, 5] = 1.0
    w = object_loss_weights(regions, 3.0)
    assert w.shape == (2, 273)
    assert w[0, 2 * 17 + 5] == 4.0 and w[0].sum() == 273 + 3.0 and (w[1] == 1).all()
    assert (w[:, 16::17] == 1).all()

    vocab = DemoVocab(words=list(C.CAPTION_WORDS))
    prompts = [vocab.prompt_ids("a red circle top left on a blue background")] * 2
    img = torch.full((2, 273), vocab.image_offset, dtype=torch.long)
    _, labels, weights = make_batch(vocab, prompts, img, [0, 0], [False, True], w)
    p = len(prompts[0])
    assert (weights[0, :p] == 0).all() and torch.equal(weights[0, p:], w[0])
    assert (weights[1, 2 : 2 + 273] == 1).all()  # the unconditional row: <bos> <boi>, then uniform

    torch.manual_seed(0)
    logits, labels = torch.randn(2, 6, 9), torch.randint(0, 9, (2, 6))
    labels[:, :2] = -100
    ones = (labels != -100).float()
    plain = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 9), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert torch.allclose(weighted_lm_loss(logits, labels, ones), plain)
    heavy = ones.clone()
    heavy[0, 3] = 5.0  # weighting one target moves the loss towards that token's loss
    ce = torch.nn.functional.cross_entropy(logits[0, 2], labels[0, 3])
    assert (weighted_lm_loss(logits, labels, heavy) - plain) * (ce - plain) > 0


@pytest.mark.parametrize("prompt_args, prompt_length", [([], 13), (["--prompt-slots", "20"], 22)],
                         ids=["slot-prompt", "word-slots"])
def test_gpt2_option_trains_loads_and_is_seed_exact(tmp_path, prompt_args, prompt_length):
    """`demo.tools.train --arch gpt2` (learned absolute positions initialised to a 2D grid; measured,
    not shipped), over the structured prompt or 20 word slots: its smoke run loads through
    load_model, every prompt has the same length, and the engine drives it exactly (gumbel:
    SJD-PAC gives AR's tokens, CFG on)."""
    import torch

    import sjd_pac_core as sp
    from sjd_pac_core.demo.tools import train

    train.main(["--smoke", "--arch", "gpt2", *prompt_args, "--out", str(tmp_path), "--no-progress"])
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert log["lm"]["arch"] == "gpt2" and log["lm"]["grid_position_init"]
    model = sp.load_model(str(tmp_path))
    assert type(model.token_model.model).__name__ == "GPT2LMHeadModel"
    # GPT-2 keeps its blocks in `h`, not `layers`: the shared KV storage must still apply.
    assert model.token_model.cache_layers == model.token_model.model.config.n_layer
    short = model.encode_prompt("a red circle top left on a blue background")
    long = model.encode_prompt("a large red circle top left and a small blue star bottom right on a white background")
    assert short.prompt_ids.shape == long.prompt_ids.shape == short.uncond_ids.shape == (prompt_length,)
    base = model.defaults.sampler_config(verify="gumbel", cfg_scale=2.0)
    ar = sp.generate_image(model, "a red circle top left on a blue background", config=base.with_(method="ar"), seed=3)
    pac = sp.generate_image(model, "a red circle top left on a blue background", config=base.with_(method="sjd_pac"), seed=3)
    assert torch.equal(ar.tokens, pac.tokens)
    assert pac.stats.forward_passes < ar.stats.forward_passes


def test_row_tokens_are_forced_and_seed_exact(smoke_demo_folder):
    """Row tokens (`demo.tools.train`'s default): the engine forces each row's own end token (AR, SJD,
    SJD-PAC under gumbel give identical tokens, CFG on) and the decoded image is the layout's grid."""
    import sjd_pac_core as sp

    model = sp.load_model(str(smoke_demo_folder))
    row_ends = model.vocab.row_end_ids()
    assert model.layout.row_end == tuple(row_ends.tolist())
    base = model.defaults.sampler_config(verify="gumbel", cfg_scale=2.0)
    runs = {m: sp.generate_image(model, "a red circle top left on a blue background", config=base.with_(method=m), seed=1)
            for m in ("ar", "sjd", "sjd_pac")}
    tokens = runs["ar"].tokens.reshape(-1)
    assert torch.equal(tokens[16::17], row_ends)
    assert all(torch.equal(r.tokens.reshape(-1), tokens) for r in runs.values())
    assert runs["ar"].images[0].size == (64, 64)


def _slot_vocab():
    return DemoVocab(words=list(C.CAPTION_WORDS) + SLOT_WORDS, prompt_format="slots")


def _slots_of(obj) -> dict:
    """The slots a generated object fills: "top left" is (top, left), "top" is (top, center)."""
    words = obj.position.split()
    vertical = next((w for w in words if w in ("top", "bottom")), "center")
    horizontal = next((w for w in words if w in ("left", "right")), "center")
    return {"vertical": vertical, "horizontal": horizontal, "size": obj.size, "colour": obj.color, "shape": obj.shape}


def test_slot_prompts_have_one_length_and_round_trip_every_caption(tmp_path):
    """The structured prompt: every caption of the generator parses into the slots of the objects
    it was drawn from, every prompt has the same length (so image token (row, column) has one absolute
    position), and the format survives vocab.json."""
    vocab = _slot_vocab()
    lengths = set()
    for split in ("train", "heldout"):
        for i in range(150):
            s = D.make_sample(0, i, split)
            parsed = parse_prompt(s.caption)
            assert parsed.objects == tuple(_slots_of(o) for o in s.objects) and parsed.background == s.background
            assert not parsed.warnings
            lengths.add(len(vocab.prompt_ids(s.caption)))
    assert lengths == {len(SLOT_NAMES) + 2} and len(vocab.uncond_prompt_ids()) == len(SLOT_NAMES) + 2
    two = vocab.prompt_ids("a small red star top left and a large blue circle bottom right on a white background")
    assert vocab.decode_ids(two[1:-1]).split() == ["top", "left", "small", "red", "star",
                                                   "bottom", "right", "large", "blue", "circle", "white"]
    vocab.save(str(tmp_path))
    again = DemoVocab.load(str(tmp_path))
    assert again.prompt_format == "slots" and torch.equal(again.prompt_ids("a red ring right on a black background"),
                                                          vocab.prompt_ids("a red ring right on a black background"))
    with pytest.raises(ValueError, match="prompt_slots"):
        DemoVocab(words=list(C.CAPTION_WORDS) + SLOT_WORDS, prompt_format="slots", prompt_slots=20)
    with pytest.raises(ValueError, match="medium"):
        DemoVocab(words=list(C.CAPTION_WORDS), prompt_format="slots")


@pytest.mark.parametrize("text, slots", [
    ("a red circle top left on a blue background", ["top", "left", "medium", "red", "circle", "blue"]),
    ("Red circle, top left, blue background.", ["top", "left", "medium", "red", "circle", "blue"]),
    ("a large red square in the centre on a white background", ["center", "center", "large", "red", "square", "white"]),
    ("a small green ring in the middle on black", ["center", "center", "small", "green", "ring", "black"]),
    ("a medium pink star upper right on a gray background", ["top", "right", "medium", "pink", "star", "gray"]),
])
def test_natural_prompts_parse_into_slots(text, slots):
    parsed = parse_prompt(text)
    got = parsed.slots()
    assert got[:5] + got[-1:] == slots and got[5:10] == [None] * 5 and not parsed.warnings


def test_missing_place_or_background_is_filled_with_a_warning():
    parsed = parse_prompt("a red circle")
    assert parsed.slots()[:5] == ["center", "center", "medium", "red", "circle"] and parsed.background == "white"
    assert any("center" in w for w in parsed.warnings) and any("background" in w for w in parsed.warnings)
    assert parse_prompt("a white circle top").background == "black"  # a light object gets a dark ground


@pytest.mark.parametrize("text, words", [
    ("a red cat on the blue field", ["cat", "field", "a large orange circle top right on a blue background"]),
    ("a red blue circle top on a black background", ["one colour and one shape"]),
    ("a circle top on a black background", ["one colour and one shape"]),
    ("a red circle top and a blue star bottom and a green ring left on a white background", ["at most 2 objects"]),
    ("a red circle top left bottom right on a white background", ["two places"]),
])
def test_prompts_outside_the_grammar_name_the_fix(text, words):
    with pytest.raises(PromptError) as err:
        parse_prompt(text)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_an_unknown_word_is_one_sentence_naming_every_size_shape_and_colour():
    """The lists in the message come from the vocabulary itself: "medium" works, so it is listed."""
    with pytest.raises(PromptError) as err:
        parse_prompt("a huge red circle")
    message = str(err.value)
    assert message.count(". ") == 0 and message.endswith(".") and "huge" in message, message
    assert all(word in message for word in [*C.SIZES, *C.SHAPES, *C.COLOR_NAMES]), message


def test_vq_trains_on_crops_and_encodes_whole_images():
    """`train_vq(crop=32)`: the fully convolutional VQ trains on random 32 px crops on the token
    grid and still encodes and decodes whole 64 px images; a crop off the grid is refused."""
    from sjd_pac_core.demo.tools.vq_training import train_vq

    ims, _ = D.generate(8, seed=0)
    vq, losses = train_vq(ims, 3, batch_size=4, config=VQConfig(codebook_size=32), progress=False, crop=32)
    assert np.isfinite(losses["mse"])
    assert vq.encode(ims[:2]).shape == (2, 16, 16) and vq.decode_to_uint8(vq.encode(ims[:2])).shape == (2, 64, 64, 3)
    with pytest.raises(ValueError, match="multiple of 4"):
        train_vq(ims, 1, batch_size=2, config=VQConfig(codebook_size=32), progress=False, crop=30)


def test_grid_position_init_codes_row_and_column():
    """GPT-2's image position embeddings start as a 2D sinusoidal grid: positions in one row
    share the row half, in one column the column half, and every cell differs."""
    from transformers import GPT2LMHeadModel

    from sjd_pac_core.demo.tools.train import grid_position_table, init_grid_positions, lm_config

    vocab = _slot_vocab()
    table = grid_position_table(vocab, 64)
    assert table.shape == (273, 64)
    row, col = table[:, :32], table[:, 32:]
    assert torch.equal(row[0], row[16]) and not torch.equal(row[16], row[17])  # <eol> closes row 0
    assert torch.equal(col[3], col[3 + 17]) and not torch.equal(col[3], col[4])
    assert len({tuple(r.tolist()) for r in table}) == 273
    model = GPT2LMHeadModel(lm_config(vocab, 64, 1, 2, 128, 512, "gpt2"))
    start = init_grid_positions(model, vocab)
    assert start == vocab.prompt_length - 1  # <boi> predicts image token 0
    assert torch.equal(model.transformer.wpe.weight[start : start + 273].detach(), table)


def test_weights_name_their_sampling_defaults(tmp_path):
    """generation_config.json's guidance_scale / temperature / top_k become the folder's defaults."""
    from sjd_pac_core.models.demo import DemoImageModel, folder_defaults

    base = DemoImageModel.defaults
    assert folder_defaults(tmp_path, base) == base
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 1.1, "guidance_scale": 1.5,
                                                                 "do_sample": True}))
    got = folder_defaults(tmp_path, base)
    assert (got.temperature, got.cfg_scale, got.top_k, got.window) == (1.1, 1.5, None, base.window)


@pytest.mark.parametrize("text", ['{"temperature": 0.8,', "[0.8]"])
def test_a_corrupt_generation_config_is_named_not_ignored(tmp_path, text):
    """A damaged generation_config.json would silently change the sampling defaults: the
    loader names the file and the fix instead."""
    from sjd_pac_core.models.demo import DemoImageModel, folder_defaults
    from sjd_pac_core.models.loader import ModelLoadError

    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(ModelLoadError, match="generation_config.json.*delete it or copy it again"):
        folder_defaults(tmp_path, DemoImageModel.defaults)


# What makes the shipped recipe (sizes and step counts differ in a smoke run).
RECIPE_KEYS = ("arch", "prompt_format", "prompt_slots", "row_tokens", "layout_weight", "layout_cells", "object_weight",
               "caption_dropout", "grid_position_init")


def test_default_training_is_the_shipped_recipe_and_seed_exact(smoke_demo_folder):
    """The training script's defaults (its smoke run) are the shipped weights' recipe: a Llama
    over the structured prompt with row tokens, the sub-token layout loss and strong clouds, with
    sampling defaults in generation_config.json; the engine drives it exactly (gumbel: AR, SJD and
    SJD-PAC give identical tokens, CFG on); a prompt outside the grammar is a ConfigError that
    names the fix."""
    import sjd_pac_core as sp

    log = json.loads((smoke_demo_folder / "training_log.json").read_text())
    with open(os.path.join(WEIGHTS_DIR, "training_log.json")) as f:
        shipped = json.load(f)
    assert {k: log["lm"][k] for k in RECIPE_KEYS} == {k: shipped["lm"][k] for k in RECIPE_KEYS}
    assert log["texture"] == shipped["texture"] == "strong"
    model = sp.load_model(str(smoke_demo_folder))
    assert type(model.token_model.model).__name__ == "LlamaForCausalLM"
    gen = json.loads((smoke_demo_folder / "generation_config.json").read_text())
    assert (model.defaults.cfg_scale, model.defaults.temperature) == (gen["guidance_scale"], gen["temperature"])
    enc = model.encode_prompt("a small red circle top left and a blue star right on a white background")
    assert enc.prompt_ids.shape == enc.uncond_ids.shape == (13,)
    base = model.defaults.sampler_config(verify="gumbel", cfg_scale=2.0)
    runs = {m: sp.generate_image(model, "a red circle top left on a blue background", config=base.with_(method=m), seed=2)
            for m in ("ar", "sjd", "sjd_pac")}
    assert all(torch.equal(r.tokens, runs["ar"].tokens) for r in runs.values())
    assert runs["sjd_pac"].stats.forward_passes < runs["ar"].stats.forward_passes
    with pytest.raises(sp.ConfigError, match="does not know the word cat"):
        model.encode_prompt("a red cat")
