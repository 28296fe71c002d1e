"""The job list: INPUT lines x seeds x methods -> typed Jobs with stable ids (no torch here).

INPUT is a text file (one prompt per line) or a JSONL file (one JSON object per line: "prompt",
optional "seed", "negative_prompt", "resolution" and any SamplerConfig field by its name, with
the CLI's conventions: null takes the model's default, top_k 0 and top_p 1 are off, window may
be "auto"). In both, blank lines and lines starting with '#' are skipped.

A job's id is a hash of everything that decides its picture: the model (name, dtype and
quantization), the
prompt, negative prompt, resolution, seed and the full SamplerConfig after the one settings
conversion over the model's defaults. So `--methods sjd-pac@64` and a JSONL line that spells the
same settings out give the same id, and a rerun recognises the jobs it has already done.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..bench.methods import RECIPE_FIELDS as SAMPLING_RECIPE_FIELDS
from ..bench.methods import MethodSpec, method_key
from ..config import ConfigError, SamplerConfig
from ..settings import SETTINGS, config_from_settings, switch

if TYPE_CHECKING:  # no torch here: the CLI reads INPUT before importing it
    from ..models.image_model import FamilyDefaults

JOB_KEYS = ("prompt", "seed", "negative_prompt", "resolution")
SETTING_KEYS = tuple(f.name for f in fields(SamplerConfig))
_SWITCHES = ("adaptive_continuation", "proactive_drafting", "tree_every_pass")
# What decides the distribution a job samples from (and, under gumbel, its tokens): jobs that
# share these, the prompt, negative prompt, resolution and seed must return AR's tokens.
RECIPE_FIELDS = ("verify", *SAMPLING_RECIPE_FIELDS)
ID_LENGTH = 16  # hex digits of sha256: 64 bits, no collision in any batch a cluster can run


class BatchInputError(ValueError):
    """INPUT or a batch option is wrong; the message names the line or option and the fix."""


@dataclass(frozen=True)
class InputLine:
    """One prompt of INPUT as written there, before the model's defaults are known."""

    number: int  # 1-based line number in INPUT
    prompt: str
    seed: Optional[int] = None
    negative_prompt: str = ""
    resolution: Optional[str] = None
    settings: Mapping[str, object] = field(default_factory=dict)  # SamplerConfig fields this line sets


@dataclass(frozen=True)
class ModelInfo:
    """What the job list needs from the loaded model (a Ray driver gets it from a worker)."""

    name: str  # the folder's name, or "demo"
    family: str
    dtype: str  # as loaded, e.g. "torch.float32"
    defaults: "FamilyDefaults"  # the family's settings and resolutions
    quantize: str = "none"  # the weight-only quantization it was loaded with

    def to_dict(self) -> dict:
        """Plain JSON values (the output folder's record of the model its jobs were planned for)."""
        return {"name": self.name, "family": self.family, "dtype": self.dtype, "quantize": self.quantize,
                "resolutions": list(self.defaults.resolutions), "sampler": dict(self.defaults.sampler)}

    @classmethod
    def from_dict(cls, values: Mapping[str, object]) -> "ModelInfo":
        from ..models.image_model import FamilyDefaults  # torch: only where a record is read

        defaults = FamilyDefaults(tuple(values["resolutions"]), dict(values["sampler"]))
        return cls(str(values["name"]), str(values["family"]), str(values["dtype"]), defaults,
                   str(values["quantize"]))


@dataclass(frozen=True)
class Job:
    """One image to make; `id` is the hash of every other field but `line` and `method`."""

    id: str
    line: int  # INPUT line, for messages
    method: str  # the summary's row, as --methods names it (e.g. "sjd-pac@64")
    model: str
    dtype: str
    quantize: str
    prompt: str
    negative_prompt: str
    resolution: str
    seed: int
    config: SamplerConfig

    @property
    def settings(self) -> Dict[str, object]:
        return asdict(self.config)

    @property
    def recipe(self) -> Tuple[object, ...]:
        """What AR's job for the same picture shares with this one, the seed aside (RECIPE_FIELDS)."""
        return (self.prompt, self.negative_prompt, self.resolution,
                *(getattr(self.config, name) for name in RECIPE_FIELDS))

    def describe(self) -> str:
        return f"line {self.line}, seed {self.seed}, {self.method}"


def job_id(model: ModelInfo, prompt: str, negative_prompt: str, resolution: str, seed: int,
           config: SamplerConfig) -> str:
    content = {"model": model.name, "dtype": model.dtype, "quantize": model.quantize, "prompt": prompt,
               "negative_prompt": negative_prompt, "resolution": resolution, "seed": seed, "settings": asdict(config)}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:ID_LENGTH]


# --- reading INPUT --------------------------------------------------------------------------------


def _looks_like_jsonl(path: Path, lines: Sequence[str]) -> bool:
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return True
    first = next((line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")), "")
    return first.startswith("{")


def _seed_value(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BatchInputError(f"{where}: seed must be a whole number 0 or more, got {value!r}; write \"seed\": 0 "
                              "or another whole number.")
    return value


def _json_line(text: str, number: int, where: str) -> InputLine:
    try:
        item = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BatchInputError(
            f"{where} is not valid JSON ({exc.msg} at column {exc.colno}); fix or delete the line (each line is "
            "one object such as {\"prompt\": \"a red circle\", \"seed\": 0}).") from None
    except RecursionError:
        raise BatchInputError(f"{where} nests its JSON too deeply to be read; write one flat object such as "
                              "{\"prompt\": \"a red circle\", \"seed\": 0}.") from None
    if not isinstance(item, dict):
        raise BatchInputError(f"{where} holds a {type(item).__name__}, not a JSON object; write "
                              "{\"prompt\": \"...\"} with optional seed, negative_prompt, resolution and settings.")
    unknown = [key for key in item if key not in JOB_KEYS + SETTING_KEYS]
    if unknown:
        raise BatchInputError(f"{where} has the unknown key {unknown[0]!r}; a line may hold "
                              f"{', '.join(JOB_KEYS + SETTING_KEYS)}.")
    prompt = item.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BatchInputError(f"{where} has no prompt; give one as \"prompt\": \"a red circle\".")
    negative = item.get("negative_prompt") or ""
    resolution = item.get("resolution")
    if not isinstance(negative, str) or not (resolution is None or isinstance(resolution, str)):
        raise BatchInputError(f"{where}: negative_prompt and resolution must be text, such as "
                              "\"resolution\": \"768x768\".")
    seed = None if item.get("seed") is None else _seed_value(item["seed"], where)
    settings = {key: value for key, value in item.items() if key in SETTING_KEYS and value is not None}
    return InputLine(number, prompt.strip(), seed, negative, resolution or None, settings)


def read_input(path: Union[str, Path]) -> List[InputLine]:
    """INPUT's prompts; BatchInputError (one sentence naming the line) for anything unreadable."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise BatchInputError(f"INPUT {path} is not a file; give a text file (one prompt per line) or a JSONL file.")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte order mark (Windows editors) is not prompt text
    except UnicodeDecodeError as exc:
        line = path.read_bytes().count(b"\n", 0, exc.start) + 1
        raise BatchInputError(f"{path} line {line} is not UTF-8 text; save the file as UTF-8.") from None
    except OSError as exc:
        raise BatchInputError(f"cannot read INPUT {path} ({exc.strerror or exc}); check the path.") from None
    raw = text.splitlines()
    jsonl = _looks_like_jsonl(path, raw)
    lines: List[InputLine] = []
    for number, line in enumerate(raw, start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{path.name} line {number}"
        lines.append(_json_line(stripped, number, where) if jsonl else InputLine(number, stripped))
    if not lines:
        raise BatchInputError(f"{path} holds no prompts; write one prompt per line, or one JSON object per line "
                              "with a \"prompt\" key.")
    return lines


# --- lines x seeds x methods -> jobs ----------------------------------------------------------------


def line_config(defaults: "FamilyDefaults", settings: Mapping[str, object]) -> SamplerConfig:
    """A line's SamplerConfig: its settings through the one conversion, over the model's defaults."""
    values = {key: (switch(value, key) if key in _SWITCHES else value) for key, value in settings.items()}
    # what the one conversion takes goes through it; the other fields straight into SamplerConfig
    direct = {key: value for key, value in values.items() if key not in SETTINGS}
    config = config_from_settings(defaults, **{k: v for k, v in values.items() if k in SETTINGS})
    config = config.with_(**direct) if direct else config
    if config.method != "sjd_pac":  # AC and PD are parts of sjd_pac: off elsewhere, as --methods sets them
        config = config.with_(adaptive_continuation=False, proactive_drafting=False)
    return config


def _checked_resolution(line: InputLine, defaults: "FamilyDefaults", where: str) -> str:
    resolutions = getattr(defaults, "resolutions", None) or ()
    resolution = line.resolution or (resolutions[0] if resolutions else "")
    if resolutions and resolution not in resolutions:
        raise BatchInputError(f"{where}: this model does not draw {resolution}; choose one of "
                              f"{', '.join(resolutions)}.")
    return resolution


def _method_conflict(line: InputLine, base: SamplerConfig, config: SamplerConfig, spec: MethodSpec) -> Optional[str]:
    for key in line.settings:
        if getattr(config, key) != getattr(base, key):
            return (f"sets {key} = {getattr(base, key)!r}, but --methods {spec.key} sets {getattr(config, key)!r}; "
                    f"drop {key} from the line or that method from --methods")
    return None


def plan_jobs(lines: Sequence[InputLine], model: ModelInfo, seeds: Optional[Sequence[int]] = None,
              methods: Optional[Sequence[MethodSpec]] = None, source: str = "INPUT") -> List[Job]:
    """Every (line, seed, method) as a Job; BatchInputError naming the line for a bad setting, a
    line whose settings --methods would overrule, or two lines that make the same job."""
    reference = line_config(model.defaults, {})
    jobs: List[Job] = []
    first_line: Dict[str, Job] = {}
    for line in lines:
        where = f"{source} line {line.number}"
        if line.seed is not None and seeds is not None:
            raise BatchInputError(f"{where} sets seed {line.seed} and --seeds gives seeds for every line; "
                                  "drop one of the two.")
        try:
            base = line_config(model.defaults, line.settings)
        except ConfigError as exc:
            raise BatchInputError(f"{where}: {exc}") from None
        resolution = _checked_resolution(line, model.defaults, where)
        for seed in [line.seed] if line.seed is not None else list(seeds or [0]):
            for spec in methods or [None]:
                try:
                    config = base if spec is None else spec.config(base)
                except ConfigError as exc:
                    raise BatchInputError(f"{where} with --methods {spec.key}: {exc}") from None
                if spec is not None:
                    conflict = _method_conflict(line, base, config, spec)
                    if conflict:
                        raise BatchInputError(f"{where} {conflict}.")
                key = spec.key if spec is not None else method_key(config, reference)
                identity = job_id(model, line.prompt, line.negative_prompt, resolution, seed, config)
                job = Job(identity, line.number, key, model.name, model.dtype, model.quantize, line.prompt,
                          line.negative_prompt, resolution, seed, config)
                if identity in first_line:
                    other = first_line[identity]
                    if other.line == line.number:
                        raise BatchInputError(f"--methods {other.method} and {job.method} run the same settings; "
                                              "drop one of them.")
                    raise BatchInputError(
                        f"{source} lines {other.line} and {line.number} make the same image ({job.method}, seed "
                        f"{seed}, same settings); delete one of them or give it another seed.")
                first_line[identity] = job
                jobs.append(job)
    return jobs
