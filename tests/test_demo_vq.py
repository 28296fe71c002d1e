"""The demo VQ tokenizer and token layout, with the shipped weights."""

import json
import os

import numpy as np
import pytest
import torch

from sjd_pac_core.demo import data as D
from sjd_pac_core.demo.model import WEIGHTS_DIR
from sjd_pac_core.demo.vocab import BOI, BOS, EOL, SPECIALS, DemoVocab
from sjd_pac_core.demo.vq import VQConfig, VQModel, to_input

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
    assert set(D.CAPTION_WORDS) <= set(vocab.words)
    p = vocab.prompt_ids("a red circle top left on a blue background")
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
    words = list(D.CAPTION_WORDS)
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
    """`python -m sjd_pac_core.demo.train --smoke` writes a complete, loadable demo folder."""
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


def test_object_loss_weights_layout_and_weighted_loss():
    """Loss weights follow the image sequence (16 rows of 16 codes + <eol>, then <eoi>): tokens
    in a caption region get 1 + object_weight, <eol>/<eoi> and the rest 1, a dropped caption
    uniform weights; the weighted loss with equal weights is the plain cross entropy."""
    from sjd_pac_core.demo.train import make_batch, object_loss_weights, weighted_lm_loss

    regions = np.zeros((2, 16, 16), np.float32)
    regions[0, 2, 5] = 1.0
    w = object_loss_weights(regions, 3.0)
    assert w.shape == (2, 273)
    assert w[0, 2 * 17 + 5] == 4.0 and w[0].sum() == 273 + 3.0 and (w[1] == 1).all()
    assert (w[:, 16::17] == 1).all()

    vocab = DemoVocab(words=list(D.CAPTION_WORDS))
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


def test_gpt2_option_trains_loads_and_is_seed_exact(tmp_path):
    """`demo.train --arch gpt2 --prompt-slots 20` (learned absolute positions; measured, not
    shipped): its smoke run loads through load_model, every prompt has the same length, and
    the engine drives it exactly (gumbel: SJD-PAC gives AR's tokens, CFG on)."""
    import torch

    import sjd_pac_core as sp
    from sjd_pac_core.demo import train

    train.main(["--smoke", "--arch", "gpt2", "--prompt-slots", "20", "--out", str(tmp_path), "--no-progress"])
    model = sp.load_model(str(tmp_path))
    assert type(model.token_model.model).__name__ == "GPT2LMHeadModel"
    # GPT-2 keeps its blocks in `h`, not `layers`: the shared KV storage must still apply.
    assert model.token_model.cache_layers == model.token_model.model.config.n_layer
    short = model.encode_prompt("a red circle top left on a blue background")
    long = model.encode_prompt("a large red circle top left and a small blue star bottom right on a white background")
    assert short.prompt_ids.shape == long.prompt_ids.shape == short.uncond_ids.shape == (22,)
    base = model.defaults.sampler_config(verify="gumbel", cfg_scale=2.0)
    ar = sp.generate_image(model, "a red circle top left on a blue background", config=base.with_(method="ar"), seed=3)
    pac = sp.generate_image(model, "a red circle top left on a blue background", config=base.with_(method="sjd_pac"), seed=3)
    assert torch.equal(ar.tokens, pac.tokens)
    assert pac.stats.forward_passes < ar.stats.forward_passes


def test_row_tokens_option_trains_loads_and_is_seed_exact(tmp_path):
    """`demo.train --row-tokens`: the engine forces each row's own end token (AR, SJD, SJD-PAC
    under gumbel give identical tokens, CFG on) and the decoded image is the layout's grid."""
    import sjd_pac_core as sp
    from sjd_pac_core.demo import train

    train.main(["--smoke", "--row-tokens", "--out", str(tmp_path), "--no-progress"])
    model = sp.load_model(str(tmp_path))
    row_ends = model.vocab.row_end_ids()
    assert model.layout.row_end == tuple(row_ends.tolist())
    base = model.defaults.sampler_config(verify="gumbel", cfg_scale=2.0)
    runs = {m: sp.generate_image(model, "a red circle top left on a blue background", config=base.with_(method=m), seed=1)
            for m in ("ar", "sjd", "sjd_pac")}
    tokens = runs["ar"].tokens.reshape(-1)
    assert torch.equal(tokens[16::17], row_ends)
    assert all(torch.equal(r.tokens.reshape(-1), tokens) for r in runs.values())
    assert runs["ar"].images[0].size == (64, 64)
