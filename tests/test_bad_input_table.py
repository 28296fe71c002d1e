"""Issue 16, one row per input: bad input to the sampler and the loader is one sentence of the
library's own exception type (ConfigError / ModelLoadError) naming the field or file, raised
before any forward pass; an input we accept instead gives exactly the canonical input's result.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

import sjd_pac_core as sp
from sjd_pac_core.models import loader
from tiny_checkpoints import build_emu3

V = 16
PROMPT = torch.tensor([1, 2, 3])
UNCOND = torch.tensor([1])
N = 8
BASE = dict(window=4)  # a small window so that several passes happen
NAN = float("nan")
INF = float("inf")


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def forward_calls(lm) -> List[int]:
    """Counts forward passes of the model: a refused input must not have run one."""
    calls: List[int] = []
    handle = lm.register_forward_pre_hook(lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    yield calls
    handle.remove()


def one_sentence(message: str) -> None:
    assert message.count(". ") == 0 and message.endswith("."), message


def sample(lm, **overrides) -> sp.SampleResult:
    args = dict(prompt_ids=PROMPT, num_tokens=N, config=sp.SamplerConfig(**BASE), seed=0)
    args.update(overrides)
    return sp.sample_tokens(lm, **args)


# --- refused: (row id, overrides of the sample call, text the message must contain) -----------
def _cfg(**fields) -> dict:
    return dict(config={**BASE, **fields})


REFUSED = [
    # config values (given as a dict, validated into a SamplerConfig)
    ("cfg_scale NaN", dict(**_cfg(cfg_scale=NAN), uncond_prompt_ids=UNCOND), "cfg_scale must be a finite number"),
    ("cfg_scale inf", dict(**_cfg(cfg_scale=INF), uncond_prompt_ids=UNCOND), "cfg_scale must be a finite number"),
    ("temperature NaN", _cfg(temperature=NAN), "temperature must be a finite number"),
    ("temperature inf", _cfg(temperature=INF), "temperature must be a finite number"),
    ("temperature inf with allowed list", dict(**_cfg(temperature=INF), allowed_tokens=[3, 4]), "temperature"),
    ("cfg_scale str", _cfg(cfg_scale="2"), "cfg_scale must be a number"),
    ("temperature str", _cfg(temperature="1.0"), "temperature must be a number"),
    ("top_p str", _cfg(top_p="0.9"), "top_p must be a number"),
    ("top_p NaN", _cfg(top_p=NAN), "top_p must be a finite number"),
    ("window bool", _cfg(window=True), "window (L) must be an integer"),
    ("tree_depth bool", _cfg(tree_depth=True), "tree_depth must be an integer"),
    ("top_k bool", _cfg(top_k=True), "top_k must be an integer"),
    ("top_k float", _cfg(top_k=2.0), "top_k must be an integer"),
    ("adaptive_continuation str", _cfg(adaptive_continuation="no"), "adaptive_continuation must be True or False"),
    ("proactive_drafting int", _cfg(proactive_drafting=1), "proactive_drafting must be True or False"),
    ("config unknown field", _cfg(windw=3), "SamplerConfig has no field 'windw'"),
    ("config list", dict(config=[("window", 4)]), "config must be a SamplerConfig or a dict"),
    # prompt_ids
    ("prompt floats", dict(prompt_ids=torch.tensor([1.0, 2.7])), "prompt_ids must hold integer token ids"),
    ("prompt 2-D batch", dict(prompt_ids=torch.tensor([[1, 2], [3, 4]])), "prompt_ids must be one prompt"),
    ("prompt bool", dict(prompt_ids=torch.tensor([True, False])), "prompt_ids must hold integer token ids"),
    ("prompt out of vocabulary", dict(prompt_ids=torch.tensor([1, 99])), "prompt_ids holds the token id 99"),
    ("prompt negative", dict(prompt_ids=torch.tensor([-1, 2])), "prompt_ids holds the token id -1"),
    ("prompt empty", dict(prompt_ids=torch.tensor([], dtype=torch.long)), "prompt_ids must be a non-empty"),
    ("prompt str", dict(prompt_ids="a red cat"), "prompt_ids must be a LongTensor"),
    # uncond_prompt_ids (with CFG on)
    ("uncond out of vocabulary", dict(**_cfg(cfg_scale=2.0), uncond_prompt_ids=torch.tensor([1, 16])),
     "uncond_prompt_ids holds the token id 16"),
    ("uncond 2-D", dict(**_cfg(cfg_scale=2.0), uncond_prompt_ids=torch.tensor([[1], [2]])),
     "uncond_prompt_ids must be one prompt"),
    ("uncond missing with CFG", _cfg(cfg_scale=2.0), "needs an unconditional prompt"),
    # allowed_tokens
    ("allowed list of fractions", dict(allowed_tokens=[2.5, 3.0]), "allowed_tokens holds fractional numbers"),
    ("allowed ids out of vocabulary", dict(allowed_tokens=[2, 99]), "allowed_tokens has ids outside 0..15"),
    ("allowed mask of the wrong length", dict(allowed_tokens=np.ones(5, dtype=bool)), "allowed_tokens must be a bool mask"),
    ("allowed empty", dict(allowed_tokens=[]), "allowed_tokens is empty"),
    ("allowed str", dict(allowed_tokens="3,4"), "allowed_tokens must be None"),
    ("tree wider than the allowed set", dict(config={"tree_width": 5}, allowed_tokens=[3, 4, 5, 6]),
     "use a tree width of at most 4"),
    # num_tokens
    ("num_tokens huge", dict(num_tokens=10**12), "num_tokens = 1,000,000,000,000 plus the prompt"),
    ("num_tokens past the context", dict(num_tokens=126), "exceed the model's context length of 128"),
    ("num_tokens bool", dict(num_tokens=True), "num_tokens must be an integer >= 1"),
    ("num_tokens float", dict(num_tokens=5.0), "num_tokens must be an integer >= 1"),
    ("num_tokens zero", dict(num_tokens=0), "num_tokens must be an integer >= 1"),
    # seed
    ("seed float", dict(seed=1.5), "seed must be an integer or None"),
    ("seed str", dict(seed="3"), "seed must be an integer or None"),
    ("seed bool", dict(seed=True), "seed must be an integer or None"),
    ("seed negative", dict(seed=-2), "seed must be between 0 and 2^64-1, or -1 for a random one"),
    ("seed past 64 bits", dict(seed=2**64), "seed must be between 0 and 2^64-1"),
    # callback
    ("callback not callable", dict(callback=3), "callback must be a function"),
    ("callback two arguments", dict(callback=lambda progress, extra: None), "cannot be called with one argument"),
    ("callback no argument", dict(callback=lambda: None), "cannot be called with one argument"),
]


@pytest.mark.parametrize("overrides,needle", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_before_any_forward_pass(lm, forward_calls, overrides, needle):
    with pytest.raises(sp.ConfigError) as err:
        sample(lm, **overrides)
    assert type(err.value) is sp.ConfigError  # the library's own type, nothing raw
    assert needle in str(err.value)
    one_sentence(str(err.value))
    assert forward_calls == []


def test_num_tokens_beyond_the_memory_a_run_needs(lm, forward_calls, monkeypatch):
    import sjd_pac_core.engine.inputs as inputs

    monkeypatch.setattr(inputs, "available_memory", lambda device: 1000)  # bytes: a full device
    with pytest.raises(sp.ConfigError) as err:
        sample(lm, num_tokens=100)
    assert "num_tokens = 100 needs about" in str(err.value) and "ask for fewer tokens" in str(err.value)
    one_sentence(str(err.value))
    assert forward_calls == []


def test_the_forward_counter_counts(lm, forward_calls):
    sample(lm)  # the control: a valid call runs forward passes, and the counter sees them
    assert len(forward_calls) >= 2


def test_rows_cover_every_config_field_type():
    # Every numeric field refuses a bool and a string; every flag refuses a non-bool.
    for field in dataclasses.fields(sp.SamplerConfig):
        bad = ["x"] if field.type == "bool" else [True, "1"]
        if field.type in ("Method", "VerifyRule", "InitProposal"):
            bad = [1]
        for value in bad:
            with pytest.raises(sp.ConfigError, match=field.name):
                sp.SamplerConfig(**{field.name: value})


def test_config_mutated_after_validation_is_checked_again(lm, forward_calls):
    config = sp.SamplerConfig(**BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.window = 0  # frozen: a validated config cannot change
    object.__setattr__(config, "temperature", NAN)  # forced past the frozen dataclass
    with pytest.raises(sp.ConfigError, match="temperature must be a finite number"):
        sample(lm, config=config)
    assert forward_calls == []
    with pytest.raises(sp.ConfigError, match="cfg_scale must be a finite number"):
        sp.SamplerConfig().with_(cfg_scale=INF)
    with pytest.raises(sp.ConfigError, match="has no field 'tree_dept'"):
        sp.SamplerConfig().with_(tree_dept=2)


# --- accepted: (row id, overrides, canonical overrides) -------------------------------------------
ALLOWED = [3, 4, 7, 9, 12]


def _mask(dtype, ids=tuple(ALLOWED)) -> torch.Tensor:
    mask = torch.zeros(V, dtype=dtype)
    mask[list(ids)] = 1
    return mask


ACCEPTED = [
    ("num_tokens numpy int", dict(num_tokens=np.int64(N)), dict()),
    ("seed numpy int", dict(seed=np.int64(3)), dict(seed=3)),
    ("seed numpy uint64 at the top", dict(seed=np.uint64(2**64 - 1)), dict(seed=2**64 - 1)),
    ("config dict", dict(config={"window": 4, "tree_depth": 2}), dict(config=sp.SamplerConfig(window=4, tree_depth=2))),
    ("config numpy values", dict(config=sp.SamplerConfig(window=np.int64(4), temperature=np.float32(0.5))),
     dict(config=sp.SamplerConfig(window=4, temperature=0.5))),
    ("prompt list", dict(prompt_ids=[1, 2, 3]), dict()),
    ("prompt numpy", dict(prompt_ids=np.array([1, 2, 3])), dict()),
    ("prompt batch of one", dict(prompt_ids=PROMPT.unsqueeze(0)), dict()),
    ("prompt int32", dict(prompt_ids=PROMPT.int()), dict()),
    ("uncond list", dict(config={"cfg_scale": 2.0, "window": 4}, uncond_prompt_ids=[1]),
     dict(config=sp.SamplerConfig(cfg_scale=2.0, window=4), uncond_prompt_ids=UNCOND)),
    ("allowed float 0/1 mask", dict(allowed_tokens=_mask(torch.float32)), dict(allowed_tokens=_mask(torch.bool))),
    ("allowed uint8 mask", dict(allowed_tokens=_mask(torch.uint8)), dict(allowed_tokens=_mask(torch.bool))),
    ("allowed int64 0/1 mask", dict(allowed_tokens=_mask(torch.int64)), dict(allowed_tokens=_mask(torch.bool))),
    ("allowed numpy bool mask", dict(allowed_tokens=_mask(torch.bool).numpy()), dict(allowed_tokens=_mask(torch.bool))),
    ("allowed list of bools", dict(allowed_tokens=_mask(torch.bool).tolist()), dict(allowed_tokens=_mask(torch.bool))),
    ("allowed per-position float mask", dict(allowed_tokens=_mask(torch.float32).expand(N, V).clone()),
     dict(allowed_tokens=_mask(torch.bool))),
    ("allowed ids as whole floats", dict(allowed_tokens=[float(i) for i in ALLOWED]), dict(allowed_tokens=ALLOWED)),
    ("allowed numpy ids", dict(allowed_tokens=np.array(ALLOWED)), dict(allowed_tokens=ALLOWED)),
    ("allowed ids as a mask", dict(allowed_tokens=ALLOWED), dict(allowed_tokens=_mask(torch.bool))),
]


@pytest.mark.parametrize("verify", ["rejection", "gumbel"])
@pytest.mark.parametrize("overrides,canonical", [r[1:] for r in ACCEPTED], ids=[r[0] for r in ACCEPTED])
def test_accepted_inputs_give_the_canonical_result(lm, overrides, canonical, verify):
    def with_verify(args: dict) -> dict:
        args = dict(args)
        config = args.get("config", sp.SamplerConfig(**BASE))
        args["config"] = sp.SamplerConfig.from_mapping({**config, "verify": verify}) if isinstance(config, dict) \
            else config.with_(verify=verify)
        return args

    got = sample(lm, **with_verify(overrides))
    want = sample(lm, **with_verify(canonical))
    assert torch.equal(got.tokens, want.tokens)
    assert got.seed == want.seed
    allowed = canonical.get("allowed_tokens")
    if allowed is not None:
        mask = sp.TokenConstraints.from_user(allowed, V, N).allowed
        assert bool(mask[got.tokens].all())  # never a token outside the allowed set


def test_the_seed_domain_is_the_same_under_both_rules(lm):
    """0 .. 2**64-1 are seeds under both rules (the top one too), and different seeds sample differently."""
    for verify in ("rejection", "gumbel"):
        config = sp.SamplerConfig(verify=verify, **BASE)
        top = sample(lm, config=config, seed=2**64 - 1, num_tokens=40)
        assert top.seed == 2**64 - 1
        assert not torch.equal(sample(lm, config=config, seed=1, num_tokens=40).tokens,
                               sample(lm, config=config, seed=0, num_tokens=40).tokens)


@pytest.mark.parametrize("random_seed", [None, -1])
@pytest.mark.parametrize("verify", ["rejection", "gumbel"])
def test_seed_none_draws_a_seed_and_reports_it(lm, verify, random_seed):
    config = sp.SamplerConfig(verify=verify, **BASE)
    first = sample(lm, config=config, seed=random_seed, num_tokens=40)
    assert isinstance(first.seed, int) and 0 <= first.seed < 2**32
    again = sample(lm, config=config, seed=first.seed, num_tokens=40)
    assert torch.equal(first.tokens, again.tokens)
    other = sample(lm, config=config, seed=None, num_tokens=40)
    assert other.seed != first.seed


def test_a_callback_that_raises_propagates_unchanged_and_frees_the_cache(lm):
    sessions = []
    adapter = sp.CausalLMAdapter(lm)
    original = adapter.open_session
    adapter.open_session = lambda prompts: sessions.append(original(prompts)) or sessions[-1]

    class Mine(Exception):
        pass

    def fail(progress):
        raise Mine("from the callback")

    with pytest.raises(Mine, match="from the callback"):
        sp.sample_tokens(adapter, PROMPT, N, config=sp.SamplerConfig(**BASE), callback=fail)
    assert sessions[0].cache is None


# --- the loader ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def emu3_folder(tmp_path_factory) -> Path:
    return build_emu3(tmp_path_factory.mktemp("emu3") / "emu3")


@pytest.fixture
def checkpoint(emu3_folder, tmp_path) -> Path:
    copy = tmp_path / "emu3"
    shutil.copytree(emu3_folder, copy)
    return copy


Q_PROJ = "layers.0.self_attn.q_proj.weight"


def _key(state: Dict[str, torch.Tensor], suffix: str) -> str:
    return next(k for k in state if k.endswith(suffix))


def _rewrite(folder: Path, change: Callable[[Dict[str, torch.Tensor]], None]) -> None:
    path = folder / "model.safetensors"
    state = load_file(path)
    change(state)
    save_file(state, path, metadata={"format": "pt"})


def _header(path: Path):
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return data, length, json.loads(data[8 : 8 + length])


def _write_header(path: Path, header: object) -> None:
    data, length, _ = _header(path)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])


def _shard(folder: Path, drop_from_index: bool = False, delete_second: bool = False) -> str:
    """Split model.safetensors into two shards with an index; return the second shard's name."""
    state = load_file(folder / "model.safetensors")
    keys = sorted(state)
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    weight_map = {}
    for name, part in zip(names, halves):
        save_file({k: state[k] for k in part}, folder / name, metadata={"format": "pt"})
        if not drop_from_index or name != names[1]:
            weight_map.update({k: name for k in part})
    (folder / "model.safetensors").unlink()
    (folder / loader.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if delete_second:
        (folder / names[1]).unlink()
    return names[1]


def _fault_missing_weight(folder: Path):
    _rewrite(folder, lambda s: s.pop(_key(s, Q_PROJ)))
    return ["model.safetensors lacks the weight", Q_PROJ, "download model.safetensors again"]


def _fault_wrong_shape(folder: Path):
    def halve(state):
        key = _key(state, Q_PROJ)
        state[key] = state[key][:16].clone()

    _rewrite(folder, halve)
    return ["model.safetensors holds the weight", Q_PROJ, "with shape [16, 32]", "config.json builds it as [32, 32]"]


def _fault_unexpected_weight(folder: Path):
    _rewrite(folder, lambda s: s.__setitem__("text_model.model.layers.0.extra.weight", torch.zeros(3)))
    return ["model.safetensors holds the weight", "layers.0.extra.weight", "does not have"]


def _fault_nan_data(folder: Path):
    path = folder / "model.safetensors"
    data, length, header = _header(path)
    key = _key(header, Q_PROJ)
    start = 8 + length + header[key]["data_offsets"][0]
    nan = struct.pack("<f", NAN) * 4
    path.write_bytes(data[:start] + nan + data[start + len(nan) :])  # header intact, data damaged
    return ["holds NaN or infinite values", Q_PROJ, "safetensors has no checksum", "download model.safetensors again"]


def _fault_truncated(folder: Path):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    return ["model.safetensors is truncated", "download it again"]


def _fault_shard_file_missing(folder: Path):
    second = _shard(folder, delete_second=True)
    return ["lacks 1 weight shard(s) named in model.safetensors.index.json", second]


def _fault_shard_missing_from_index(folder: Path):
    _shard(folder, drop_from_index=True)
    return ["model.safetensors.index.json names no shard for the weight", "download the index and every shard"]


def _fault_header_not_a_dict(folder: Path):
    _write_header(folder / "model.safetensors", [1, 2])
    return ["model.safetensors has a safetensors header that is a JSON list", "download it again"]


def _fault_entry_without_offsets(folder: Path):
    path = folder / "model.safetensors"
    _, _, header = _header(path)
    key = _key(header, Q_PROJ)
    del header[key]["data_offsets"]
    _write_header(path, header)
    return ["model.safetensors has a broken header entry for the weight", key]


def _fault_config_list(folder: Path):
    (folder / "config.json").write_text("[1, 2, 3]")
    return ["config.json holds a JSON list", "download it again"]


def _fault_config_string(folder: Path):
    (folder / "config.json").write_text('"emu3"')
    return ["config.json holds a JSON str"]


def _fault_config_not_utf8(folder: Path):
    (folder / "config.json").write_bytes(b'{"model_type": "\xff\xfe"}')
    return ["config.json is not UTF-8 text"]


def _fault_index_not_utf8(folder: Path):
    _shard(folder)
    (folder / loader.INDEX_NAME).write_bytes(b"\xff\xfe{}")
    return ["model.safetensors.index.json is not UTF-8 text"]


def _fault_index_not_a_dict(folder: Path):
    _shard(folder)
    (folder / loader.INDEX_NAME).write_text('["model-00001-of-00002.safetensors"]')
    return ["model.safetensors.index.json holds a JSON list"]


LOADER_FAULTS = {
    "missing weight": _fault_missing_weight,
    "wrong shape": _fault_wrong_shape,
    "unexpected weight": _fault_unexpected_weight,
    "corrupted data section (NaN)": _fault_nan_data,
    "truncated file": _fault_truncated,
    "shard file missing": _fault_shard_file_missing,
    "shard missing from the index": _fault_shard_missing_from_index,
    "header not a dict": _fault_header_not_a_dict,
    "header entry without data_offsets": _fault_entry_without_offsets,
    "config.json a list": _fault_config_list,
    "config.json a string": _fault_config_string,
    "config.json not UTF-8": _fault_config_not_utf8,
    "index not UTF-8": _fault_index_not_utf8,
    "index not a dict": _fault_index_not_a_dict,
}


@pytest.mark.parametrize("fault", list(LOADER_FAULTS), ids=list(LOADER_FAULTS))
def test_loader_faults_are_one_sentence_naming_the_file(checkpoint, fault):
    needles = LOADER_FAULTS[fault](checkpoint)
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(checkpoint, dtype="fp32", device="cpu")
    message = str(err.value)
    assert type(err.value) is sp.ModelLoadError
    assert str(checkpoint) in message
    for needle in needles:
        assert needle in message, message
    one_sentence(message)


def test_a_clean_sharded_checkpoint_loads(checkpoint):
    _shard(checkpoint)
    model = sp.load_model(checkpoint, dtype="fp32", device="cpu")
    assert model.family == "emu3"


def test_the_finiteness_check_can_be_switched_off_for_large_models(checkpoint):
    _fault_nan_data(checkpoint)
    model = sp.load_model(checkpoint, dtype="fp32", device="cpu", check_finite=False)  # the user's choice
    assert model.family == "emu3"
    with pytest.raises(sp.ModelLoadError, match="check_finite must be None, True or False"):
        sp.load_model(checkpoint, check_finite="yes")


@pytest.mark.parametrize("path", [None, 3, 2.5, ["demo"]])
def test_load_model_path_of_the_wrong_type(path):
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(path)
    assert type(err.value) is sp.ModelLoadError and "model path must be a folder path" in str(err.value)
    one_sentence(str(err.value))


def test_demo_weights_with_a_missing_or_nan_weight_name_the_rebuild(tmp_path):
    copy = tmp_path / "demo"
    shutil.copytree(loader.DEMO_FOLDER, copy)
    _rewrite(copy, lambda s: s.pop("model.layers.0.self_attn.q_proj.weight"))
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(copy, device="cpu")
    message = str(err.value)
    assert "model.safetensors lacks the weight model.layers.0.self_attn.q_proj.weight" in message
    assert "python -m sjd_pac_core.demo.tools.train" in message
    one_sentence(message)

    shutil.copy(loader.DEMO_FOLDER / "model.safetensors", copy / "model.safetensors")
    _rewrite(copy, lambda s: s["model.layers.0.mlp.up_proj.weight"].view(-1)[:3].fill_(INF))
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(copy, device="cpu")
    assert "model.layers.0.mlp.up_proj.weight" in str(err.value) and "infinite" in str(err.value)
    one_sentence(str(err.value))
