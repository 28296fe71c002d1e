"""Checks of a checkpoint's files and loaded weights, each failure one sentence naming the fix.

The families and the loader both use these; this module imports no family and no loader, so the
families never import the loader (the loader imports them lazily through its table).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Type

import torch

class ModelLoadError(ValueError):
    """The folder is not a checkpoint we can load; the message names the fix."""


# The oldest transformers the adapters run on: 5.17 lacks the static cache's rollback
# (StaticLayer.crop) and builds the attention masks of a tree pass in another shape.
MIN_TRANSFORMERS = "5.24"


def check_transformers_version(installed: Optional[str] = None) -> None:
    """One sentence, before any file is read, when the installed transformers is too old."""
    from packaging.version import Version

    if installed is None:
        import transformers

        installed = transformers.__version__
    if Version(installed) < Version(MIN_TRANSFORMERS):
        raise ModelLoadError(
            f"transformers {installed} is installed but sjd-pac needs {MIN_TRANSFORMERS} or newer; run "
            f"pip install -U \"transformers>={MIN_TRANSFORMERS}\" in this Python environment."
        )


# Every safetensors data type (safetensors 0.8) and its width in bits.
SAFETENSORS_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "F8_E5M2": 8, "F8_E4M3": 8,
                    "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
                    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}


def is_integer_dtype(dtype: str) -> bool:
    """A safetensors integer or bool type (no floating-point weight can be stored as one)."""
    return dtype == "BOOL" or dtype[0] in "IU"


def require_file(path: Path) -> None:
    """A weight file must be a regular file: one sentence for a folder or a broken link."""
    if path.is_dir():
        raise ModelLoadError(
            f"{path} is a folder, not a weight file; remove or rename it (the weights are *.safetensors files)."
        )
    if not path.exists():
        target = path.readlink() if path.is_symlink() else None
        raise ModelLoadError(
            f"{path} is a link to {target}, which does not exist; download the file again or fix the link."
            if target is not None else f"{path} does not exist; download it again."
        )


class _DuplicateName(ValueError):
    pass


def _no_duplicates(pairs):
    names = [name for name, _ in pairs]
    seen = set()
    for name in names:
        if name in seen:
            raise _DuplicateName(name)
        seen.add(name)
    return dict(pairs)


def read_safetensors_header(path: Path) -> dict:
    """The JSON header of a .safetensors file, checked: a dict of tensor entries, each named once,
    with a known dtype, a shape and data_offsets that hold exactly that many bytes, laid end to end
    as safetensors requires. ModelLoadError naming the file and the fix."""
    require_file(path)
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len <= 0 or 8 + header_len > size:
                raise ValueError("header longer than the file")
            header = json.loads(f.read(header_len).decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _DuplicateName as name:
        raise ModelLoadError(
            f"{path} names the weight {name} twice in its header, so the file is damaged; download it again."
        ) from None
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"{path} is not a readable safetensors file ({exc}); download it again."
        ) from None
    except RecursionError:
        raise ModelLoadError(f"{path} has a safetensors header nested too deeply to be read, so the file is "
                             "damaged; download it again.") from None
    if not isinstance(header, dict):
        raise ModelLoadError(
            f"{path} has a safetensors header that is a JSON {type(header).__name__}, not a table of "
            "tensors; download it again."
        )
    metadata = header.get("__metadata__", {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise ModelLoadError(
            f"{path} has a __metadata__ entry that is not a table of text values (safetensors allows only "
            "those), so the header is damaged; download it again."
        )
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1] and isinstance(shape, list)
            and all(isinstance(d, int) and d >= 0 for d in shape)
        ):
            raise ModelLoadError(
                f"{path} has a broken header entry for the weight {name} (no valid shape and "
                "data_offsets); download it again."
            )
        dtype = entry.get("dtype")
        if not isinstance(dtype, str) or dtype not in SAFETENSORS_BITS:
            raise ModelLoadError(
                f"{path} stores the weight {name} as {dtype!r}, which is not a safetensors data type, so the "
                "header is damaged; download it again."
            )
        need = math.prod(shape) * SAFETENSORS_BITS[dtype]
        if need != 8 * (offsets[1] - offsets[0]):
            raise ModelLoadError(
                f"{path} gives the weight {name} ({dtype}, shape {_shape(shape)}) {offsets[1] - offsets[0]:,} bytes, "
                f"but that type and shape take {need / 8:,g}, so the header is damaged; download it again."
            )
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    if any(a[1] != b[0] for a, b in zip(spans, spans[1:])) or (spans and spans[0][0] != 0):
        raise ModelLoadError(
            f"{path} has weights whose data overlap or leave gaps, so the header is damaged; download it again."
        )
    return header


def check_safetensors(path: Path) -> None:
    """Raise ModelLoadError if a .safetensors file is truncated or not a safetensors file."""
    header = read_safetensors_header(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        raise ModelLoadError(
            f"{path} is truncated ({size:,} of {8 + header_len + end:,} bytes); download it again."
        )
    if 8 + header_len + end < size:
        raise ModelLoadError(
            f"{path} has {size - 8 - header_len - end:,} bytes after its last weight, which its header does not "
            "describe, so the file is damaged; download it again."
        )


def read_tensor_file(path: Path, error: Type[Exception], keep: Tuple[str, ...], download: str,
                     plain_copy: str, convert_command: str) -> Dict[str, torch.Tensor]:
    """The tensors of a .safetensors file, or of a .ckpt's state dict (its "state_dict", else the
    dict itself), whose keys start with one of `keep` (all if empty), never unpickling an object.

    The .ckpt is read by torch's weights-only loader, memory-mapped where its format allows (the
    tensors left out are never read into memory). A file holding other Python objects - a
    trainer's callback, or code planted in a crafted file - is refused with `plain_copy` (where a
    file of plain tensors comes from) and `convert_command`, which re-saves a trusted file's
    tensors as the .safetensors read instead. Every failure is one sentence of type `error`;
    `download` (how to get the .ckpt again) names its fix."""
    converted = path.with_suffix(".safetensors").name
    kept = (lambda key: key.startswith(keep)) if keep else (lambda key: True)
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            check_safetensors(path)
            with safe_open(str(path), framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys() if kept(k)}
        except ModelLoadError as exc:
            raise error(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error type
            raise error(f"{path} cannot be read ({type(exc).__name__}); convert {path.with_suffix('.ckpt').name} to it "
                        "again.") from None
    try:
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            blob = torch.load(path, map_location="cpu", weights_only=True)  # the legacy format
    except Exception as exc:  # noqa: BLE001 - any unpickling failure lands here
        if "weights_only" in str(exc) or "Weights only" in str(exc) or "Unsupported" in str(exc):
            raise error(
                f"{path} holds Python objects besides tensors, which sjd-pac never unpickles because a crafted "
                f"file could run code; {plain_copy} (plain tensors), or, only if you trust this file, re-save its "
                f"tensors in its folder with `{convert_command}` ({converted} is then read instead)."
            ) from None
        raise error(f"{path} cannot be read ({type(exc).__name__}); it is probably truncated - {download}.") from None
    state = blob.get("state_dict", blob) if isinstance(blob, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise error(f"{path} holds no state dict of tensors; {download}.")
    return {k: v for k, v in state.items() if kept(k)}


def check_weight_files(folder: Path) -> None:
    for path in sorted(folder.glob("*.safetensors")):
        check_safetensors(path)


def require_safetensors(folder: Path, repo_hint: str) -> None:
    """The folder must hold the weights as safetensors, every shard its index names included."""
    index_path = folder / INDEX_NAME
    if index_path.is_file():
        shards = set(read_weight_map(index_path).values())
        missing = sorted(s for s in shards if not (folder / s).is_file())
        if missing:
            raise ModelLoadError(
                f"{folder} lacks {len(missing)} weight shard(s) named in model.safetensors.index.json "
                f"(first: {missing[0]}); download all model-*.safetensors files of {repo_hint}."
            )
    elif not any(folder.glob("*.safetensors")):
        raise ModelLoadError(
            f"{folder} has no *.safetensors weights; download the model*.safetensors files of {repo_hint} "
            "into it (PyTorch .bin checkpoints are not loaded)."
        )


INDEX_NAME = "model.safetensors.index.json"


def read_json_dict(path: Path) -> dict:
    """A JSON file that must hold an object; ModelLoadError naming the file otherwise."""
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise ModelLoadError(f"{path} is not UTF-8 text, so it is damaged; download it again.") from None
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON ({exc}); download it again.") from None
    except RecursionError:  # Python's reader gives up past about a thousand levels; real files have a few
        raise ModelLoadError(f"{path} nests its JSON too deeply to be read, so it is damaged; download it "
                             "again.") from None
    if not isinstance(value, dict):
        raise ModelLoadError(
            f"{path} holds a JSON {type(value).__name__}, not an object of settings; download it again."
        )
    return value


# The JSON files of a checkpoint folder that transformers (or the demo loader) reads with Python's
# JSON reader, each an object: read once here, so that a damaged one is a sentence naming it before
# any weight is read (inside transformers it is a TypeError or a RecursionError naming nothing).
CHECKPOINT_JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json",
                         "special_tokens_map.json", "added_tokens.json", "vocab.json", "processor_config.json",
                         "preprocessor_config.json", "chat_template.json", "vq_config.json", INDEX_NAME)


def check_json_files(folder: Path) -> None:
    """Every file of CHECKPOINT_JSON_FILES in `folder` is a readable JSON object (read_json_dict)."""
    for name in CHECKPOINT_JSON_FILES:
        if (folder / name).is_file():
            read_json_dict(folder / name)


def read_weight_map(index_path: Path) -> Dict[str, str]:
    """The weight name -> shard file table of a model.safetensors.index.json."""
    weight_map = read_json_dict(index_path).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelLoadError(f"{index_path} has no valid weight_map (weight -> shard file); download it again.")
    if not weight_map:
        raise ModelLoadError(f"{index_path} names no weight at all (its weight_map is empty); download the index "
                             "and every shard it lists again.")
    return weight_map


def checkpoint_numel(folder: Path) -> int:
    """Parameters in the folder's safetensors files, from their headers (no weights read)."""
    total = 0
    for path in folder.glob("*.safetensors"):
        header = read_safetensors_header(path)
        for key, value in header.items():
            if key == "__metadata__":
                continue
            count = 1
            for dim in value["shape"]:
                count *= dim
            total += count
    return total


# --- do the loaded weights match the files? ---------------------------------------------------
def _find_key(name: str, keys, fuzzy: bool) -> Optional[str]:
    """name among keys; with fuzzy, also under another prefix (transformers may rename the
    checkpoint's keys on load): only leading components before the first layer index are
    dropped, and at least three components are kept, so layer 1 never matches layer 0."""
    if name in keys:
        return name
    parts = name.split(".")
    first_index = next((i for i, p in enumerate(parts) if p.isdigit()), len(parts))
    for start in range(1, min(first_index - 1, len(parts) - 3) + 1 if fuzzy else 0):
        suffix = ".".join(parts[start:])
        hits = [k for k in keys if k == suffix or k.endswith("." + suffix)]
        if len(hits) == 1:
            return hits[0]
    return None


def weight_file(folder: Path, name: str, fuzzy: bool = True) -> Optional[str]:
    """The file that holds (or should hold) a weight, for the fix in an error message: the
    index's shard for it, else the safetensors file whose header names it, else the only weight
    file. INDEX_NAME when the index names no shard for it; None when unknown."""
    index_path = folder / INDEX_NAME
    if index_path.is_file():
        weight_map = read_weight_map(index_path)
        key = _find_key(name, weight_map, fuzzy)
        return weight_map[key] if key is not None else INDEX_NAME
    files = sorted(folder.glob("*.safetensors"))
    for path in files:
        if _find_key(name, read_safetensors_header(path), fuzzy) is not None:
            return path.name
    return files[0].name if len(files) == 1 and fuzzy else None


def _shape(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def weight_problem(
    folder: Path, missing=(), unexpected=(), mismatched=(), errors=(), file: Optional[str] = None
) -> Optional[str]:
    """One sentence for the first problem of a load, naming the file, the weight and the fix;
    None when the load was clean. mismatched holds (name, checkpoint shape, model shape); file
    names the weight file when there is only one in question."""
    missing, unexpected, mismatched, errors = sorted(missing), sorted(unexpected), sorted(mismatched), list(errors)
    count = len(missing) + len(unexpected) + len(mismatched)
    more = f" (and {count - 1} more weight problems)" if count > 1 else ""
    if missing:
        name = missing[0]
        where = file or weight_file(folder, name) or "*.safetensors"
        if where == INDEX_NAME:
            return (f"{folder / INDEX_NAME} names no shard for the weight {name}{more}, so the model would "
                    "run with random weights there; download the index and every shard it lists again.")
        return (f"{folder / where} lacks the weight {name}{more} (a partial or damaged download), so the "
                f"model would run with random weights there; download {where} again"
                f"{' (the index names the shard)' if (folder / INDEX_NAME).is_file() else ''}.")
    if mismatched:
        name, ckpt, model = mismatched[0]
        where = file or weight_file(folder, name) or "*.safetensors"
        return (f"{folder / where} holds the weight {name} with shape {_shape(ckpt)}, but config.json builds "
                f"it as {_shape(model)}{more}; download {where} and config.json of the same checkpoint again.")
    if unexpected:
        name = unexpected[0]
        where = file or weight_file(folder, name) or "*.safetensors"
        return (f"{folder / where} holds the weight {name}, which the model built from config.json does not "
                f"have{more}; download config.json and {where} of the same checkpoint again.")
    if errors:
        first = " ".join(str(errors[0]).split())[:200]
        return f"Loading the weights in {folder} reported an error ({first}); download the checkpoint again."
    return None


def check_loading_info(folder: Path, info: dict) -> None:
    """Every missing, unexpected or mismatched weight in transformers' loading info
    (from_pretrained(..., output_loading_info=True)) is a ModelLoadError."""
    problem = weight_problem(
        folder,
        missing=info.get("missing_keys", ()),
        unexpected=info.get("unexpected_keys", ()),
        mismatched=info.get("mismatched_keys", ()),
        errors=info.get("error_msgs", ()),
    )
    if problem is not None:
        raise ModelLoadError(problem)


def check_checkpoint_matches(path: Path, expected: Dict[str, torch.Size]) -> None:
    """The weights in a safetensors file must be exactly `expected` (name -> shape), read from
    the header alone; for checkpoints whose names are the module's own (no renaming on load)."""
    header = {k: v for k, v in read_safetensors_header(path).items() if k != "__metadata__"}
    problem = weight_problem(
        path.parent,
        missing=[k for k in expected if k not in header],
        unexpected=[k for k in header if k not in expected],
        mismatched=[(k, header[k]["shape"], tuple(expected[k])) for k in expected
                    if k in header and list(header[k]["shape"]) != list(expected[k])],
        file=path.name,
    )
    if problem is not None:
        raise ModelLoadError(problem)


def model_weight_files(folder: Path) -> List[Path]:
    """The files from_pretrained reads: the shards the index names, else model.safetensors (a
    tokenizer's own weights, such as vqgan.safetensors, may sit next to them)."""
    index_path = folder / INDEX_NAME
    if index_path.is_file():
        return [folder / name for name in sorted(set(read_weight_map(index_path).values()))]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else sorted(folder.glob("*.safetensors"))


def check_weight_dtypes(folder: Path, floating: Dict[str, bool], files: Optional[List[Path]] = None) -> None:
    """An integer or bool tensor in a weight file where the model (built from config.json on the
    meta device; floating: its state-dict name -> is floating point) holds a floating-point one is
    a damaged header: F32 rewritten as I32 has the same width, so it would load without a word."""
    names = list(floating)
    for path in files if files is not None else model_weight_files(folder):
        for key, entry in read_safetensors_header(path).items():
            if key == "__metadata__" or not is_integer_dtype(entry["dtype"]):
                continue
            match = _find_key(key, names, fuzzy=True)
            if match is not None and floating[match]:
                raise ModelLoadError(
                    f"{path} stores the weight {key} as {entry['dtype']} (integers), but the model holds it in "
                    f"floating point, so the file's header is damaged; download {path.name} again."
                )


# Checked by default up to this many parameters (the demo, small models); larger models check
# on request (load_model(check_finite=True)): a pass over every weight is then a noticeable cost.
FINITE_CHECK_DEFAULT_LIMIT = 2_000_000_000


def _torch_modules(obj: object, depth: int = 2) -> List[torch.nn.Module]:
    """The torch modules an image model holds, directly or one object deep (adapters, wrappers),
    without the ones that are part of another (an adapter's body inside its model)."""
    found: List[torch.nn.Module] = []
    for value in vars(obj).values() if hasattr(obj, "__dict__") else ():
        if isinstance(value, torch.nn.Module):
            found.append(value)
        elif depth > 1 and hasattr(value, "__dict__") and not isinstance(value, (torch.Tensor, type)):
            found.extend(_torch_modules(value, depth - 1))
    unique = list({id(m): m for m in found}.values())
    inner = {id(sub) for m in unique for sub in m.modules() if sub is not m}
    return [m for m in unique if id(m) not in inner]


_FINITE_CHUNK = 1 << 26  # elements per isfinite call: bounds the temporary bool tensor to 64 MB


def _all_finite(t: torch.Tensor) -> torch.Tensor:
    """A 0-dim bool tensor on t's device (no host sync)."""
    chunks = t.detach().reshape(-1).split(_FINITE_CHUNK)
    return torch.stack([torch.isfinite(c).all() for c in chunks]).all()


def first_non_finite(modules: List[torch.nn.Module]) -> Optional[Tuple[torch.nn.Module, str]]:
    """The module and name of the first floating-point parameter or buffer holding NaN or inf,
    else None. One host sync per module and device (not per weight); offloaded (meta) weights
    are skipped."""
    for module in modules:
        # Quantized weights (tensor subclasses of torchao, bitsandbytes) were checked as they loaded.
        named = [(n, t) for n, t in list(module.named_parameters()) + list(module.named_buffers())
                 if type(t) in (torch.Tensor, torch.nn.Parameter) and t.is_floating_point()
                 and t.device.type != "meta" and t.numel() > 0]
        by_device: Dict[torch.device, List[int]] = {}
        for i, (_, t) in enumerate(named):
            by_device.setdefault(t.device, []).append(i)
        for rows in by_device.values():
            flags = torch.stack([_all_finite(named[i][1]) for i in rows]).cpu()
            if not bool(flags.all()):
                return module, named[rows[int((~flags).nonzero()[0, 0])]][0]
    return None


def check_finite_weights(model: object, folder: Path) -> None:
    """ModelLoadError naming the first weight that holds NaN or inf: safetensors has no checksum,
    so a damaged data section behind an intact header loads without a word otherwise."""
    from transformers import PreTrainedModel

    found = first_non_finite(_torch_modules(model))
    if found is None:
        return
    module, name = found
    # A transformers model may rename its checkpoint's keys; other modules (a VQ decoder read
    # from its own file) are looked up by their exact names only.
    where = weight_file(folder, name, fuzzy=isinstance(module, PreTrainedModel))
    source = f"{folder / where}" if where not in (None, INDEX_NAME) else f"the weight files in {folder}"
    raise ModelLoadError(
        f"The weight {name} loaded from {source} holds NaN or infinite values, so the file is damaged "
        f"(safetensors has no checksum); download {where if where not in (None, INDEX_NAME) else 'them'} again."
    )
