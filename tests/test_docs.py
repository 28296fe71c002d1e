"""The README's and docs' examples name only what exists, and the Python API example runs.

Checked in README.md and docs/*.md (CHANGELOG.md is history and may name what is gone):

* every ```bash block, and every inline code span that is a command (`sjd-pac ...`,
  `python -m ...`): its program is one we ship or document; `sjd-pac`, `sjd-pac-app`,
  `python -m MODULE` and `python SCRIPT.py` of this repository parse their arguments with their
  own argparse parser (so a misspelt flag or a removed subcommand fails), other modules must be
  importable, `hf` flags are read from `hf <command> --help`, `pip install -r FILE` / `-e .[extra]`
  name a file and extras that exist, `git clone` names the project's repository, and every
  repository path a command names exists;
* every ```python block (and a `python - <<EOF` heredoc): it compiles, imports only names that
  exist, and calls what it imports with keywords it takes; a block preceded by the line
  `<!-- doc-test: run -->` is run (in a temporary folder);
* in the prose: every relative link and #anchor resolves, every inline `sjd_pac_core.x.y` name
  imports, every inline repository path exists, every inline `test_*` name is a test, every
  inline `--flag` is an option of a command the docs run (or a listed flag of another program);
* docs/architecture.md's module tree names every module of the packages, and nothing else.

Every failure names the doc file, the line and the bad name. The `test_checker_*` tests plant a
misspelt flag, a missing module and the like, and show the checker reports each.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib
import importlib.util
import inspect
import io
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS: Dict[str, str] = PYPROJECT["project"]["scripts"]  # "sjd-pac" -> "sjd_pac_core.cli:main"
EXTRAS = set(PYPROJECT["project"].get("optional-dependencies", {}))
REPOSITORY = PYPROJECT["project"]["urls"]["Repository"]
PACKAGES = ("sjd_pac_core", "sjd_pac_app", "nodes")
RUN_MARKER = "<!-- doc-test: run -->"
FILE_SUFFIXES = {"py", "md", "json", "jsonl", "txt", "png", "jpg", "js", "yaml", "toml", "ckpt", "safetensors"}

# Programs a doc may name without a check of their arguments (a user's shell, not ours).
PLAIN_PROGRAMS = {"cd", "export", "source", ".", "echo", "ln", "ssh", "apt-get", "sudo", "ls", "mkdir",
                  "ray"}
# Flags of other programs that the prose mentions (ComfyUI's server, pytest, pip, venv, ...).
FOREIGN_FLAGS = {
    "--cpu", "--preview-method", "--clear", "--durations", "--local-dir", "--index-url", "-n",
    "--help",
}


def top_level_entries() -> set:
    skip = {"runs", "build", "dist", "out.png"}
    return {p.name for p in ROOT.iterdir()
            if (not p.name.startswith(".") or p.name == ".ci") and p.name not in skip
            and not p.name.endswith(".egg-info")}


TOP = top_level_entries()
CORE_SUBPACKAGES = {p.name for p in (ROOT / "sjd_pac_core").iterdir() if p.is_dir() and (p / "__init__.py").exists()}


# --- reading the docs ------------------------------------------------------------------------------
@dataclass
class Block:
    doc: str  # path relative to the repository, for messages
    line: int  # 1-based line of the block's first content line
    lang: str
    text: str
    run: bool = False


@dataclass
class Span:
    doc: str
    line: int
    text: str


def rel(path: Path) -> str:
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:  # a planted doc in a temporary folder
        return path.name


def read_doc(path: Path) -> Tuple[List[Block], List[Span], List[Tuple[int, str]]]:
    """Fenced blocks, inline code spans and the prose lines (outside fences) of one markdown file."""
    blocks: List[Block] = []
    spans: List[Span] = []
    prose: List[Tuple[int, str]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    fence: Optional[str] = None
    lang, start, body, run, previous = "", 0, [], False, ""
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if fence is None:
            match = re.match(r"(`{3,}|~{3,})\s*([\w+-]*)", stripped)
            if match:
                fence, lang, start, body = match.group(1), match.group(2).lower(), number + 1, []
                run = previous == RUN_MARKER
                continue
            prose.append((number, line))
            for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", line):
                spans.append(Span(rel(path), number, span))
            if stripped:
                previous = stripped
        elif stripped.startswith(fence) and stripped.strip("`~") == "":
            blocks.append(Block(rel(path), start, lang, "\n".join(body), run))
            fence, previous = None, ""
        else:
            body.append(line)
    return blocks, spans, prose


# --- shell commands -------------------------------------------------------------------------------
@dataclass
class Command:
    line: int
    argv: List[str]
    heredoc: Optional[str] = None


def strip_comment(line: str) -> str:
    """The line without a shell comment (a # at the start of a word, outside quotes)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def shell_commands(text: str, first_line: int) -> List[Command]:
    """Simple commands of a shell snippet (split at ;, &&, ||, |), with their line numbers."""
    commands: List[Command] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        number, line = first_line + i, strip_comment(lines[i])
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + strip_comment(lines[i])
        heredoc = None
        match = re.search(r"<<-?\s*(['\"]?)(\w+)\1", line)
        if match:
            end, body = match.group(2), []
            line = line[: match.start()] + line[match.end():]
            i += 1
            while i < len(lines) and lines[i].strip() != end:
                body.append(lines[i])
                i += 1
            heredoc = "\n".join(body)
        i += 1
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, ""
        try:
            tokens = list(lexer)
        except ValueError as exc:
            commands.append(Command(number, ["<unparsable>", str(exc)]))
            continue
        current: List[str] = []
        skip_next = False
        for token in tokens + [";"]:
            if skip_next:
                skip_next = False
                continue
            if token and set(token) <= set(";&|"):
                if current:
                    commands.append(Command(number, current, heredoc if heredoc and current[0].startswith("python") else None))
                current = []
                continue
            if re.match(r"\d*(>>?|<)", token):  # a redirection: drop it (and its target)
                skip_next = bool(re.fullmatch(r"\d*(>>?|<)&?", token))
                continue
            current.append(token)
    return commands


# --- argparse, stopped right after parsing ----------------------------------------------------------
class Parsed(Exception):
    """Raised instead of running a program once its arguments have parsed."""


@dataclass
class ParseResult:
    ok: bool
    message: str = ""
    options: Tuple[str, ...] = ()  # every option string of the parsers that took part


@contextlib.contextmanager
def stop_after_parse(seen_help: List[str]) -> Iterator[None]:
    """Patch argparse so that the outermost parse_args / parse_known_args raises Parsed when it
    returns: the program's own parser checks the arguments, and the program does no work."""
    originals = {name: getattr(argparse.ArgumentParser, name) for name in ("parse_args", "parse_known_args")}
    depth = 0

    def wrap(name):
        def probe(self, args=None, namespace=None):
            nonlocal depth
            if depth == 0:  # no abbreviations: a doc must spell every flag out
                parsers = [self]
                for action in self._actions:  # noqa: SLF001 - the subcommands' options too
                    if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                        parsers += list(action.choices.values())
                for parser in parsers:
                    parser.allow_abbrev = False
                    seen_help.append(parser.format_help())
            depth += 1
            try:
                result = originals[name](self, args, namespace)
            finally:
                depth -= 1
            if depth == 0:
                raise Parsed()
            return result
        return probe

    for name in originals:
        setattr(argparse.ArgumentParser, name, wrap(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(argparse.ArgumentParser, name, original)


def options_in(help_texts: Sequence[str]) -> Tuple[str, ...]:
    return tuple(sorted({m for text in help_texts for m in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text)}))


@functools.lru_cache(maxsize=None)
def parse_with(kind: str, target: str, args: Tuple[str, ...]) -> ParseResult:
    """Parse `args` with the parser of a console script ("script"), a module run with -m
    ("module") or a script file ("path"); never runs the program."""
    helps: List[str] = []
    out, err = io.StringIO(), io.StringIO()
    saved_argv = sys.argv
    try:
        with stop_after_parse(helps), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if kind == "script":
                module, _, func = SCRIPTS[target].partition(":")
                sys.argv = [target, *args]
                getattr(importlib.import_module(module), func)()
            elif kind == "module":
                sys.argv = [target, *args]
                runpy.run_module(target, run_name="__main__", alter_sys=False)
            else:
                sys.argv = [target, *args]
                runpy.run_path(str(ROOT / target), run_name="__main__")
    except Parsed:
        return ParseResult(True, options=options_in(helps))
    except SystemExit as exc:
        if exc.code in (0, None):  # --help
            return ParseResult(True, options=options_in(helps))
        message = (err.getvalue().strip().splitlines() or [f"exit status {exc.code}"])[-1]
        return ParseResult(False, message, options_in(helps))
    except Exception as exc:  # noqa: BLE001 - an import error or a crash before parsing
        return ParseResult(False, f"{type(exc).__name__}: {exc}")
    finally:
        sys.argv = saved_argv
    return ParseResult(False, "ran to its end without parsing any arguments (no argparse parser?)")


@functools.lru_cache(maxsize=None)
def hf_options(command: str) -> Optional[Tuple[str, ...]]:
    """Flags of `hf COMMAND` (huggingface_hub's CLI, installed with transformers 5), from its
    --help; None if there is no such command (or no `hf` at all)."""
    hf = shutil.which("hf") or str(Path(sys.executable).with_name("hf"))
    if not Path(hf).exists():
        return None
    done = subprocess.run([hf, command, "--help"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NO_COLOR": "1"})
    if done.returncode != 0:
        return None
    return options_in([done.stdout])


def ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def repo_path(token: str) -> Optional[Path]:
    """The repository file a command or span names, or None when it names none (an output, a URL,
    a folder of the user's). `custom_nodes/sjd-pac/X` and `sjd-pac/X` are this repository's X."""
    token = token.strip("\"'").rstrip(",.;:)")
    if "://" in token or token.startswith(("$", "~", "-")) or "<" in token or "=" in token:
        return None
    if "sjd-pac/" in token:
        token = token.rsplit("sjd-pac/", 1)[1]
    parts = token.split("/")
    if parts[0] in TOP and (len(parts) > 1 or token in TOP):
        return ROOT / token
    if len(parts) > 1 and parts[0] in CORE_SUBPACKAGES and token.endswith(".py"):
        return ROOT / "sjd_pac_core" / token  # short form: engine/loop.py
    return None


def missing_path(token: str) -> Optional[str]:
    path = repo_path(token)
    if path is None:
        return None
    text = str(path)
    if any(c in text for c in "*?["):
        return None if list(ROOT.glob(path.relative_to(ROOT).as_posix())) else token
    return None if path.exists() else token


def check_python_flags(argv: List[str]) -> Tuple[Optional[str], Optional[str], List[str]]:
    """python [-X ...] (-m MODULE | -c CODE | - | SCRIPT) ARGS -> (kind, target, args)."""
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-c", "-"):
        i += 1
    if i >= len(argv):
        return None, None, []
    if argv[i] == "-m" and i + 1 < len(argv):
        return "module", argv[i + 1], argv[i + 2:]
    if argv[i] == "-c":
        return "code", argv[i + 1] if i + 1 < len(argv) else "", []
    if argv[i] == "-":
        return "stdin", None, []
    return "path", argv[i], argv[i + 1:]


def check_command(cmd: Command, inline: bool = False) -> List[str]:
    """Problems with one simple command (empty when it is fine)."""
    argv = list(cmd.argv)
    while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):  # VAR=value prefixes
        argv.pop(0)
    if argv and argv[0] in ("sudo", "env"):
        argv.pop(0)
    if not argv:
        return []
    program, problems = argv[0], []
    shown = shlex.join(cmd.argv)
    for token in argv[1:]:
        bad = missing_path(token)
        if bad:
            problems.append(f"`{shown}`: the path {bad} does not exist in the repository")

    def parsed(kind: str, target: str, args: List[str]) -> None:
        result = parse_with(kind, target, tuple(args))
        if not result.ok and not (inline and "arguments are required" in result.message):
            problems.append(f"`{shown}`: {result.message}")
        KNOWN_OPTIONS.update(result.options)

    if program in SCRIPTS:
        parsed("script", program, argv[1:])
    elif re.fullmatch(r"python(3(\.\d+)?)?", program):
        kind, target, args = check_python_flags(argv)
        if kind == "module":
            if target == "pip":
                problems += check_pip(["pip", *args], shown)
            elif ours(target):
                if importlib.util.find_spec(target.split(".")[0]) is None:
                    problems.append(f"`{shown}`: no module {target}")
                else:
                    parsed("module", target, args)
            else:
                try:
                    found = importlib.util.find_spec(target)
                except ModuleNotFoundError:
                    found = None
                if found is None:
                    problems.append(f"`{shown}`: no module named {target}")
        elif kind == "path":
            path = ROOT / target
            if not path.is_file():
                problems.append(f"`{shown}`: the script {target} does not exist")
            else:
                parsed("path", target, args)
        elif kind == "stdin" and cmd.heredoc is not None:
            problems += check_python_code(cmd.heredoc, "<heredoc>")
    elif program in ("pip", "pip3"):
        problems += check_pip(argv, shown)
    elif program == "pytest":
        for arg in argv[1:]:
            if arg.startswith("-"):
                continue
            path, _, test = arg.partition("::")
            if not (ROOT / path).exists():
                problems.append(f"`{shown}`: the test file {path} does not exist")
            elif test and not re.search(rf"def {re.escape(test.split('[')[0])}\b", (ROOT / path).read_text()):
                problems.append(f"`{shown}`: {path} has no test {test}")
    elif program == "bash":
        if len(argv) > 1 and not (ROOT / argv[1]).is_file():
            problems.append(f"`{shown}`: the script {argv[1]} does not exist")
    elif program == "git":
        if argv[1:2] == ["clone"]:
            urls = [a for a in argv[2:] if "://" in a]
            if urls and urls[0].removesuffix(".git") != REPOSITORY:
                problems.append(f"`{shown}`: the repository is {REPOSITORY}, not {urls[0]}")
    elif program == "hf":
        sub = argv[1] if len(argv) > 1 else ""
        options = hf_options(sub)
        if options is None:
            problems.append(f"`{shown}`: `hf` has no command {sub!r} (or `hf` is not installed)")
        else:
            for arg in argv[2:]:
                flag = arg.split("=")[0]
                if flag.startswith("-") and flag not in options:
                    problems.append(f"`{shown}`: `hf {sub}` has no option {flag}")
    elif program not in PLAIN_PROGRAMS:
        problems.append(f"`{shown}`: unknown program {program!r} (not ours, not in PLAIN_PROGRAMS)")
    return problems


def check_pip(argv: List[str], shown: str) -> List[str]:
    problems = []
    for flag, value in zip(argv, argv[1:]):
        if flag == "-r" and missing_path(value) is None and repo_path(value) is None:
            if not (ROOT / value.rsplit("sjd-pac/", 1)[-1]).exists():
                problems.append(f"`{shown}`: the requirements file {value} does not exist")
        if flag == "-e" or (flag == "install" and value.startswith(".")):
            match = re.fullmatch(r"\.\[([\w,-]+)\]", value)
            for extra in (match.group(1).split(",") if match else []):
                if extra not in EXTRAS:
                    problems.append(f"`{shown}`: pyproject.toml has no extra [{extra}] (it has {sorted(EXTRAS)})")
    return problems


KNOWN_OPTIONS: set = set()


# --- python snippets -------------------------------------------------------------------------------
def check_python_code(code: str, where: str) -> List[str]:
    """Compile `code`; every import must resolve, every attribute of an imported module exist,
    every call of an imported callable take the keywords it is given."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return [f"line {exc.lineno} of the block: {exc.msg}"]
    problems: List[str] = []
    names: Dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                try:
                    module = importlib.import_module(alias.name)
                except ImportError as exc:
                    problems.append(f"line {node.lineno} of the block: import {alias.name}: {exc}")
                    continue
                names[alias.asname or alias.name.split(".")[0]] = module if alias.asname else \
                    importlib.import_module(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            try:
                module = importlib.import_module(node.module)
            except ImportError as exc:
                problems.append(f"line {node.lineno} of the block: from {node.module}: {exc}")
                continue
            for alias in node.names:
                try:
                    names[alias.asname or alias.name] = getattr(module, alias.name)
                except AttributeError:
                    try:
                        names[alias.asname or alias.name] = importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        problems.append(f"line {node.lineno} of the block: {node.module} has no name {alias.name}")

    def resolve(expr: ast.AST) -> Tuple[bool, object]:
        if isinstance(expr, ast.Name) and expr.id in names:
            return True, names[expr.id]
        if isinstance(expr, ast.Attribute):
            found, owner = resolve(expr.value)
            if found and inspect.ismodule(owner):
                if not hasattr(owner, expr.attr):
                    problems.append(f"line {expr.lineno} of the block: {owner.__name__} has no name {expr.attr}")
                    return False, None
                return True, getattr(owner, expr.attr)
        return False, None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            resolve(node)
        if isinstance(node, ast.Call):
            found, func = resolve(node.func)
            if not found or not callable(func):
                continue
            try:
                signature = inspect.signature(func)
            except (TypeError, ValueError):
                continue
            params = signature.parameters
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue
            for keyword in node.keywords:
                if keyword.arg is not None and keyword.arg not in params:
                    problems.append(f"line {node.lineno} of the block: {getattr(func, '__name__', func)}() "
                                    f"takes no keyword {keyword.arg}")
    # Dedupe (resolve runs for nested attributes more than once).
    return list(dict.fromkeys(problems))


# --- prose ------------------------------------------------------------------------------------------
def github_slug(heading: str) -> str:
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path: Path) -> set:
    found, fence = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith(("```", "~~~")):
            fence = not fence
        elif not fence and line.startswith("#"):
            found.add(github_slug(line.lstrip("#")))
    return found


def check_links(doc: Path, prose: List[Tuple[int, str]], base: Optional[Path] = None) -> List[str]:
    """Relative links resolve from `base` (the doc's folder unless given)."""
    problems, base = [], base or doc.parent
    for number, line in prose:
        text = re.sub(r"`[^`]*`", "", line)
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path_part, _, anchor = target.partition("#")
            path = (base / path_part).resolve() if path_part else doc
            if not path.exists():
                problems.append(f"{rel(doc)}:{number}: the link {target} points at nothing")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                problems.append(f"{rel(doc)}:{number}: the link {target}: {path.name} has no heading #{anchor}")
    return problems


def dotted_name_problem(name: str) -> Optional[str]:
    """`sjd_pac_core.bench.plots.acceptance_histograms`: the longest importable module, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module_name) is None:
                continue
        except ModuleNotFoundError:
            continue
        obj = importlib.import_module(module_name)
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return f"{module_name} has no name {'.'.join(parts[cut:])}"
            obj = getattr(obj, attr)
        return None
    return f"no module {parts[0]}"


@functools.lru_cache(maxsize=None)
def defined_test_names() -> set:
    names = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    for path in (ROOT / "tests").glob("*.py"):
        names |= set(re.findall(r"def (test_\w+)", path.read_text(encoding="utf-8")))
    return names


@functools.lru_cache(maxsize=None)
def code_index() -> Tuple[Dict[str, str], Dict[str, str]]:
    """Our classes (name -> module) and our modules by their unique last name (loop -> module)."""
    classes: Dict[str, List[str]] = {}
    modules: Dict[str, List[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            dotted = dotted.removesuffix(".__init__")
            modules.setdefault(path.parent.name if path.stem == "__init__" else path.stem, []).append(dotted)
            for name in re.findall(r"^class (\w+)", path.read_text(encoding="utf-8"), re.MULTILINE):
                classes.setdefault(name, []).append(dotted)
    variable_like = {"model", "config", "state", "stats", "__main__"}
    unique = lambda index, skip=(): {k: v[0] for k, v in index.items() if len(v) == 1 and k not in skip}
    return unique(classes), unique(modules, variable_like)


def member_names(obj: object) -> set:
    names = set(dir(obj))
    for klass in getattr(obj, "__mro__", ()):
        names |= set(getattr(klass, "__annotations__", {}))  # dataclass fields without defaults
    return names


def qualified_name_problem(text: str) -> Optional[str]:
    """`RunStats.step_compression`, `sp.SamplerConfig.from_mapping`, `drafters.make_drafter`,
    `Verdict.decisions()`: the owner is one of our classes or modules, and it has the members."""
    parts = text.removeprefix("sp.").removesuffix("()").split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts) or parts[-1] in FILE_SUFFIXES:
        return None
    classes, modules = code_index()
    if parts[0] in classes:
        obj = getattr(importlib.import_module(classes[parts[0]]), parts[0], None)
    elif parts[0] in modules:
        obj = importlib.import_module(modules[parts[0]])
    else:
        return None  # not ours (a transformers class, a variable)
    for attr in parts[1:]:
        if obj is None or attr not in member_names(obj):
            return f"{'.'.join(parts[:parts.index(attr)])} has no member {attr}"
        obj = getattr(obj, attr, None)
    return None


COMMAND_SPAN = re.compile(r"(sjd-pac(-app)?( |$)|python3? (-m |[\w/]+\.py)|hf |pytest )")


def check_span(span: Span) -> List[str]:
    text = span.text.strip()
    where = f"{span.doc}:{span.line}"
    if COMMAND_SPAN.match(text):
        return [f"{where}: {p}" for c in shell_commands(text, span.line) for p in check_command(c, inline=True)]
    if re.fullmatch(r"(sjd_pac_core|sjd_pac_app)(\.\w+)+", text):
        problem = dotted_name_problem(text)
        return [f"{where}: `{text}`: {problem}"] if problem else []
    problem = qualified_name_problem(text)
    if problem:
        return [f"{where}: `{text}`: {problem}"]
    if re.fullmatch(r"test_\w+", text) and text not in defined_test_names():
        return [f"{where}: `{text}` is not a test in tests/"]
    if " " not in text:
        bad = missing_path(text)
        if bad:
            return [f"{where}: the path {bad} does not exist in the repository"]
    return []


def check_span_flags(span: Span) -> List[str]:
    """An inline `--flag` (or `--flag value`) must be an option of some command the docs run."""
    match = re.fullmatch(r"(--[a-z][\w-]*)(=\S*| .*)?", span.text.strip())
    if not match or match.group(1) in FOREIGN_FLAGS or match.group(1) in KNOWN_OPTIONS:
        return []
    return [f"{span.doc}:{span.line}: `{span.text}`: {match.group(1)} is not an option of any command "
            "the docs run (add it to FOREIGN_FLAGS if it belongs to another program)"]


# --- the module tree of docs/architecture.md -----------------------------------------------------
def architecture_tree_problems() -> List[str]:
    """Every .py module of the packages appears in the tree block of docs/architecture.md (a
    line names a file, or several files of one folder), and every file it names exists."""
    path = ROOT / "docs" / "architecture.md"
    blocks, _, _ = read_doc(path)
    trees = [b for b in blocks if b.lang == "text" and "sjd_pac_core/" in b.text]
    if not trees:
        return ["docs/architecture.md: no ```text block with the module tree"]
    problems, named = [], set()
    for block in trees:
        stack: List[Tuple[int, str]] = []  # (indent, folder)
        for offset, line in enumerate(block.text.splitlines()):
            if not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            while stack and stack[-1][0] >= indent:
                stack.pop()
            prefix = stack[-1][1] if stack else ""
            head = re.split(r"\s{2,}", line.strip())
            files = []
            for token in head:
                for word in token.split():
                    if re.fullmatch(r"[\w./-]+/|[\w./-]+\.(py|js|json|md|txt|toml)", word):
                        files.append(word)
                if not token.endswith((".py", "/")) and not re.search(r"\.py\b", token):
                    break  # the rest is the description
            for word in files:
                if word.endswith("/"):
                    if word == files[0]:
                        stack.append((indent, prefix + word))
                    if not (ROOT / (prefix + word)).is_dir():
                        problems.append(f"docs/architecture.md:{block.line + offset}: {prefix + word} does not exist")
                else:
                    name = prefix + word
                    named.add(name)
                    if not (ROOT / name).is_file():
                        problems.append(f"docs/architecture.md:{block.line + offset}: {name} does not exist")
    for package in PACKAGES:
        for module in sorted((ROOT / package).rglob("*.py")):
            name = rel(module)
            if name not in named:
                problems.append(f"docs/architecture.md: the module tree does not list {name}")
    return problems


# --- the tests -----------------------------------------------------------------------------------
def doc_problems(doc: Path, link_base: Optional[Path] = None) -> List[str]:
    blocks, spans, prose = read_doc(doc)
    problems: List[str] = []
    for block in blocks:
        if block.lang in ("bash", "sh", "shell"):
            for cmd in shell_commands(block.text, block.line):
                problems += [f"{block.doc}:{cmd.line}: {p}" for p in check_command(cmd)]
        elif block.lang == "python":
            problems += [f"{block.doc}:{block.line}: {p}" for p in check_python_code(block.text, block.doc)]
    for span in spans:
        problems += check_span(span)
    for span in spans:  # after the commands, so that their options are known
        problems += check_span_flags(span)
    problems += check_links(doc, prose, link_base)
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_doc_names_only_what_exists(doc: Path) -> None:
    # The options every doc's commands define, so that a flag named in one doc's prose may be
    # defined by a command of another.
    for other in DOCS:
        blocks, _, _ = read_doc(other)
        for block in blocks:
            if block.lang in ("bash", "sh", "shell"):
                for cmd in shell_commands(block.text, block.line):
                    check_command(cmd)
    problems = doc_problems(doc)
    assert not problems, "stale names in the docs:\n" + "\n".join(problems)


def runnable_blocks() -> List[Block]:
    return [b for doc in DOCS for b in read_doc(doc)[0] if b.run]


def test_readme_has_a_runnable_api_example() -> None:
    assert any(b.doc == "README.md" and b.lang == "python" for b in runnable_blocks()), (
        f"README.md has no ```python block marked {RUN_MARKER}")


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda b: f"{b.doc}:{b.line}")
def test_python_example_runs(block: Block, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        exec(compile(block.text, f"{block.doc}:{block.line}", "exec"), {"__name__": "__doc_example__"})
    except Exception as exc:  # noqa: BLE001 - report the doc line
        frame = [f for f in __import__("traceback").extract_tb(exc.__traceback__) if f.filename.startswith(block.doc)]
        line = block.line + frame[-1].lineno - 1 if frame else block.line
        pytest.fail(f"{block.doc}:{line}: the example fails: {type(exc).__name__}: {exc}")


def test_architecture_tree_matches_the_modules() -> None:
    problems = architecture_tree_problems()
    assert not problems, "docs/architecture.md is out of date:\n" + "\n".join(problems)


def test_no_issue_numbers_or_machine_notes_in_user_docs() -> None:
    pattern = re.compile(r"\bissues? \d+|#\d+\b|\bstolen\b|\btoday\b|\bthis (cpu|machine|virtual machine|session|task)\b|"
                         r"\bvirtual machine\b|\ba slower day\b|\bthe lead\b|\blent\b", re.IGNORECASE)
    problems = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for match in pattern.finditer(re.sub(r"<!--.*?-->", "", line)):  # comments are not shown
                problems.append(f"{rel(doc)}:{number}: {match.group(0)!r}")
    assert not problems, "notes that belong in CHANGELOG.md or nowhere:\n" + "\n".join(problems)


# --- the README's figures and the nodes' names -------------------------------------------------------
RESULTS_PAGE = ROOT / "docs" / "benchmark.md"
NODE_DOCS = [ROOT / "README.md", ROOT / "docs" / "comfyui.md"]


def ratio_figures(text: str) -> set:
    """Every ratio written with decimals ("5.66x", "0.91x") in `text`."""
    return set(re.findall(r"(?<![\d.])\d+\.\d+x\b", text))


def figures_not_on(page: str, readme: str) -> List[str]:
    return sorted(ratio_figures(readme) - ratio_figures(page))


def test_every_ratio_the_readme_cites_is_on_the_results_page() -> None:
    """A reader can find each of the README's figures, with its command, in docs/benchmark.md."""
    missing = figures_not_on(RESULTS_PAGE.read_text(encoding="utf-8"), (ROOT / "README.md").read_text(encoding="utf-8"))
    assert not missing, f"README.md cites figures docs/benchmark.md does not hold: {missing}"


def test_the_figure_check_sees_a_figure_missing_from_the_page() -> None:
    assert figures_not_on("| a | 3.14x | 0.91x |", "gives 3.14x, 0.91x and 9.87x (not 12.5)") == ["9.87x"]


def display_names() -> Dict[str, str]:
    """nodes/__init__.py's NODE_DISPLAY_NAME_MAPPINGS, read without importing the pack."""
    tree = ast.parse((ROOT / "nodes" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "NODE_DISPLAY_NAME_MAPPINGS"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("nodes/__init__.py defines no NODE_DISPLAY_NAME_MAPPINGS")


def node_name_problems(text: str, names: Dict[str, str]) -> List[str]:
    """A node named otherwise than ComfyUI shows it: a display name missing from `text`, or the
    class name in words ("Load AR Image Model") where the display name says something else."""
    flat = " ".join(text.split())
    problems = [f"does not name {shown!r}" for shown in names.values() if shown not in flat]
    for cls, shown in names.items():
        words = " ".join(re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z][a-z]+|[A-Z]+", cls))
        if words not in shown and words in flat:
            problems.append(f"calls the node {shown!r} {words!r}")
    return problems


@pytest.mark.parametrize("doc", NODE_DOCS, ids=rel)
def test_docs_name_the_nodes_as_comfyui_shows_them(doc: Path) -> None:
    problems = node_name_problems(doc.read_text(encoding="utf-8"), display_names())
    assert not problems, f"{rel(doc)}: " + "; ".join(problems)


def test_the_node_name_check_sees_an_old_name() -> None:
    names = {"LoadARImageModel": "Load Emu3, Janus, Lumina (SJD-PAC)", "SJDStats": "SJD Stats (speculative decoding)"}
    text = "Use *Load AR Image Model* and *SJD Stats (speculative\n decoding)*; *Load Emu3, Janus, Lumina (SJD-PAC)*."
    assert node_name_problems(text, names) == [
        "calls the node 'Load Emu3, Janus, Lumina (SJD-PAC)' 'Load AR Image Model'"]
    assert node_name_problems("SJD Stats alone", names) == [
        "does not name 'Load Emu3, Janus, Lumina (SJD-PAC)'", "does not name 'SJD Stats (speculative decoding)'"]


# --- the checker catches what it should ------------------------------------------------------------
def problems_of(markdown: str, tmp_path: Path) -> List[str]:
    doc = tmp_path / "_planted_test_doc.md"  # never inside the repository: other workers collect DOCS
    doc.write_text(markdown, encoding="utf-8")
    return doc_problems(doc, link_base=ROOT / "docs")


@pytest.mark.parametrize("markdown, expected", [
    ("```bash\nsjd-pac generate \"a red circle\" --upscael 4\n```\n", "unrecognized arguments: --upscael"),
    ("```bash\nsjd-pac generat \"a red circle\"\n```\n", "invalid choice: 'generat'"),
    ("```bash\npython -m sjd_pac_core.demo.trian --out x\n```\n", "sjd_pac_core.demo.trian"),
    ("```bash\npython -m sjd_pac_core.demo.tools.quality --seedz 0\n```\n", "unrecognized arguments: --seedz"),
    ("```bash\nhuggingface-cli download BAAI/Emu3-Gen-hf --local-dir emu3-gen\n```\n", "unknown program 'huggingface-cli'"),
    ("```bash\nhf download BAAI/Emu3-Gen-hf --local-dirr emu3-gen\n```\n", "no option --local-dirr"),
    ("```bash\npip install -e \".[ap]\"\n```\n", "no extra [ap]"),
    ("```bash\npytest tests/test_nope.py\n```\n", "tests/test_nope.py does not exist"),
    ("```python\nimport sjd_pac_core as sp\nsp.load_modle('demo')\n```\n", "has no name load_modle"),
    ("```python\nfrom sjd_pac_core import SamplerConfig\nSamplerConfig(windw=3)\n```\n", "takes no keyword windw"),
    ("```python\nimport sjd_pac_core.nope\n```\n", "import sjd_pac_core.nope"),
    ("See `python -m sjd_pac_core.demo.calibrat --sjd-only`.\n", "sjd_pac_core.demo.calibrat"),
    ("See `sjd_pac_core.bench.plots.no_such_function`.\n", "has no name no_such_function"),
    ("See `sjd_pac_core/engine/no_such.py`.\n", "sjd_pac_core/engine/no_such.py does not exist"),
    ("See `test_no_such_test_anywhere`.\n", "is not a test"),
    ("See `RunStats.no_such_field` and `TreeShape.from_pathz`.\n", "RunStats has no member no_such_field"),
    ("See `drafters.make_drafterz`.\n", "drafters has no member make_drafterz"),
    ("See [the models](models.md#no-such-heading).\n", "has no heading #no-such-heading"),
    ("See [x](no_such_file.md).\n", "points at nothing"),
    ("Use `--no-such-flag-anywhere`.\n", "--no-such-flag-anywhere is not an option"),
])
def test_checker_reports_planted_mistakes(markdown: str, expected: str, tmp_path: Path) -> None:
    problems = problems_of(markdown, tmp_path)
    assert any(expected in p and "_planted_test_doc.md:" in p for p in problems), problems


def test_checker_accepts_correct_examples(tmp_path: Path) -> None:
    markdown = (
        "```bash\nsjd-pac generate \"a red circle\" -o out.png --upscale 4 --window 12\n"
        "python -m sjd_pac_core.demo.tools.quality --seeds 0\nhf download BAAI/Emu3-Gen-hf --local-dir emu3-gen\n```\n"
        "```python\nimport sjd_pac_core as sp\ncfg = sp.SamplerConfig(window=12)\n```\n"
        "See `sjd_pac_core/engine/loop.py`, `sjd_pac_core.bench.plots`, `--upscale` and [models](models.md#lumina-mgpt).\n"
    )
    assert problems_of(markdown, tmp_path) == []
