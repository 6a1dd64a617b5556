"""`data dataset`: local datasets through Hugging Face `datasets` (JSONL, Parquet, CSV, Arrow, save_to_disk),
text or chat rows (the tokenizer's own template), `shuffle` in `Dataset.shuffle(seed)`'s order, the row
policies, what `qrc check` reports from the schema alone, and memory flat in the dataset's size."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from compiler.cli import app
from compiler.data import calibration_batches, verify_batches
from compiler.frontend import check_file
from compiler.models import index_model

datasets = pytest.importorskip("datasets")
from transformers import PreTrainedTokenizerFast  # noqa: E402  (after the skip: the hf extra)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "recipes" / "data"
TOKENIZER = DATA / "tokenizer"
runner = CliRunner()


def recipe(tmp_path: Path, data: str, options: str, backend: str = "onnx", name: str = "r.recipe") -> Path:
    path = tmp_path / name
    out = tmp_path / ("out.onnx" if backend == "onnx" else "out")
    path.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    backend {backend}\n'
                    '    quantize { type Linear -> W8A8_STATIC  "lm_head" -> none }\n'
                    f'    calibrate {{\n        data dataset "{data}" {{ {options} }}\n        chunk 4\n    }}\n'
                    f'    verify {{ samples 4 }}\n    emit "{out}"\n}}\n')
    return path


def source_of(path: Path):
    result = check_file(path)
    assert result.ir is not None, result.diagnostics
    return result.ir.calibration.data, index_model(result.ir.model)


def ids_of(path: Path, chunk: int = 64) -> np.ndarray:
    data, index = source_of(path)
    return np.concatenate([c["input_ids"] for c in calibration_batches(data, index, chunk)])


def tokenizer():
    return PreTrainedTokenizerFast.from_pretrained(str(TOKENIZER), local_files_only=True)


def corpus_texts() -> list[str]:
    return [json.loads(line)["text"] for line in (DATA / "corpus.jsonl").read_text().splitlines()]


def same_rows_in_every_format(tmp_path: Path) -> dict[str, Path]:
    """corpus.jsonl's rows as Parquet, CSV, an Arrow file, and a save_to_disk DatasetDict folder."""
    table = datasets.Dataset.from_dict({"text": corpus_texts()})
    out = {"jsonl": DATA / "corpus.jsonl", "parquet": DATA / "corpus.parquet"}
    out["csv"] = tmp_path / "corpus.csv"
    table.to_csv(str(out["csv"]), index=False)
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": table}).save_to_disk(str(saved))
    out["saved"] = saved
    arrow = tmp_path / "corpus.arrow"
    arrow.write_bytes(next((saved / "train").glob("*.arrow")).read_bytes())
    out["arrow"] = arrow
    return out


@pytest.mark.parametrize("shuffle", ["", "shuffle  seed 7"])
def test_every_format_gives_the_same_samples(tmp_path, shuffle):
    paths = same_rows_in_every_format(tmp_path)
    options = f'text "text"  tokenizer "{TOKENIZER}"  rows pad  samples 20  seqlen 16  {shuffle}'
    found = {kind: ids_of(recipe(tmp_path, str(path), options, name=f"{kind}.recipe")) for kind, path in paths.items()}
    first = found["jsonl"]
    assert first.shape == (20, 16)
    for kind, ids in found.items():
        assert np.array_equal(ids, first), kind


def test_shuffle_takes_the_rows_datasets_shuffle_gives(tmp_path):
    """The same rows, in the same order, as `load_dataset(...).shuffle(seed).select(range(n))`, tokenised and
    padded by the tokenizer itself: an outside check of the order and the tokens."""
    path = recipe(tmp_path, str(DATA / "corpus.jsonl"),
                  f'text "text"  tokenizer "{TOKENIZER}"  shuffle  seed 42  rows pad  samples 12  seqlen 20')
    ours = ids_of(path)
    rows = datasets.load_dataset("json", data_files=str(DATA / "corpus.jsonl"), split="train")
    picked = list(rows.shuffle(seed=42).select(range(12))["text"])
    tok = tokenizer()
    theirs = tok(picked, truncation=True, max_length=20, padding="max_length")["input_ids"]
    assert np.array_equal(ours, np.array(theirs))
    assert not np.array_equal(ours, ids_of(recipe(tmp_path, str(DATA / "corpus.jsonl"),
                                                  f'tokenizer "{TOKENIZER}"  rows pad  samples 12  seqlen 20',
                                                  name="unshuffled.recipe")))


def test_chat_rows_go_through_the_tokenizers_own_template(tmp_path):
    """Chat rows rendered by transformers' `apply_chat_template`, packed end to end: the samples are the
    template's tokens in order, cut every seqlen."""
    path = recipe(tmp_path, str(DATA / "chat.jsonl"),
                  f'messages "messages"  tokenizer "{TOKENIZER}"  rows pack  samples 6  seqlen 32')
    ours = ids_of(path)
    tok = tokenizer()
    stream: list[int] = []
    for line in (DATA / "chat.jsonl").read_text().splitlines():
        stream += tok.apply_chat_template(json.loads(line)["messages"], tokenize=True, return_dict=True)["input_ids"]
    assert np.array_equal(ours.ravel(), np.array(stream[:6 * 32]))
    assert ours[0, 0] == tok.bos_token_id and tok.convert_tokens_to_ids("<|user|>") in ours


def test_row_policies(tmp_path):
    """pad: every row a sample, short ones padded and masked; truncate: short rows skipped, no padding;
    pack: every position a token, nothing masked."""
    base = f'tokenizer "{TOKENIZER}"  samples 40  seqlen 24'
    tok = tokenizer()
    lengths = [len(tok(t)["input_ids"]) for t in corpus_texts()]
    for policy, rows in (("pad", 40), ("truncate", sum(n >= 24 for n in lengths[:48])), ("pack", 40)):
        data, index = source_of(recipe(tmp_path, str(DATA / "corpus.jsonl"), f"{base}  rows {policy}",
                                       name=f"{policy}.recipe"))
        chunks = list(calibration_batches(data, index, 64))
        mask = np.concatenate([c["attention_mask"] for c in chunks])
        assert mask.shape == (min(rows, 40), 24), policy
        if policy == "pad":
            assert mask.sum(axis=1).tolist() == [min(n, 24) for n in lengths[:40]]
        else:
            assert mask.all(), policy


def test_verification_takes_the_rows_after_calibrations(tmp_path):
    path = recipe(tmp_path, str(DATA / "corpus.jsonl"), f'tokenizer "{TOKENIZER}"  rows pad  samples 10  seqlen 16')
    data, index = source_of(path)
    held, overlaps = verify_batches(data, index, 4, 4)
    calibration = np.concatenate([c["input_ids"] for c in calibration_batches(data, index, 4)])
    held_ids = np.concatenate([c["input_ids"] for c in held])
    assert not overlaps and held_ids.shape == (4, 16)
    assert np.array_equal(np.concatenate([calibration, held_ids]), ids_of(recipe(
        tmp_path, str(DATA / "corpus.jsonl"), f'tokenizer "{TOKENIZER}"  rows pad  samples 14  seqlen 16', name="14.recipe")))


@pytest.mark.parametrize("case, code, where", [
    ('messages "conversation"  tokenizer "{tok}"', "Q434", 'messages "conversation"'),
    ('tokenizer "{tok}/tokenizer.json"  messages "messages"', "Q436", 'messages "messages"'),
    ('tokenizer "{tok}"  split "validation"', "Q435", 'split "validation"'),
    ('messages "messages"', "Q216", "data dataset"),
])
def test_check_reads_the_schema_and_points_at_the_setting(tmp_path, case, code, where):
    path = recipe(tmp_path, str(DATA / "chat.jsonl"), case.format(tok=TOKENIZER))
    if code == "Q435":  # a DatasetDict folder without that split
        saved = tmp_path / "saved"
        datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a b c"]})}).save_to_disk(str(saved))
        path = recipe(tmp_path, str(saved), case.format(tok=TOKENIZER))
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 2 and f"error[{code}]" in result.output, result.output
    line = re.search(rf"error\[{code}\].*?\n --> .*?:(\d+):", result.output, re.S)
    assert line is not None and where in path.read_text().splitlines()[int(line.group(1)) - 1], result.output


def test_empty_files_and_hub_names_are_refused_at_check(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    table = tmp_path / "none.parquet"
    datasets.Dataset.from_dict({"text": []}).to_parquet(str(table))
    for data, code in ((empty, "Q435"), (table, "Q435"), ("someone/not-downloaded-dataset", "Q401")):
        result = runner.invoke(app, ["check", str(recipe(tmp_path, str(data), f'tokenizer "{TOKENIZER}"'))])
        assert result.exit_code == 2 and f"error[{code}]" in result.output, (data, result.output)
    assert "huggingface-cli download" in result.output  # the hub name: how to get a local copy


def test_a_text_file_named_as_json_is_refused_at_check(tmp_path):
    """A .jsonl that is plain text (a text file given as a dataset) is Q401 at `qrc check`, from its first
    character; before, check said ok and the compile stopped after loading the model. A JSON document that opens
    with `[` on a line of its own still checks, as do leading blank lines."""
    text = tmp_path / "notes.jsonl"
    text.write_text("\n  some plain text, one sample a line\nanother line\n")
    result = runner.invoke(app, ["check", str(recipe(tmp_path, str(text), f'tokenizer "{TOKENIZER}"'))])
    assert result.exit_code == 2 and "error[Q401]" in result.output, result.output
    assert "is not JSON (it begins with `s`" in result.output and "`data text`" in result.output, result.output
    document = tmp_path / "rows.json"
    document.write_text("\n[\n  {\"text\": \"a row of text\"}\n]\n")
    result = runner.invoke(app, ["check", str(recipe(tmp_path, str(document), f'tokenizer "{TOKENIZER}"'))])
    assert result.exit_code == 0, result.output


def test_bad_rows_stop_the_compile_with_a_code_and_nothing_written(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": "not a list"}) + "\n")
    path = recipe(tmp_path, str(bad), f'messages "messages"  tokenizer "{TOKENIZER}"')
    result = runner.invoke(app, ["compile", str(path)])
    assert result.exit_code == 2 and "error[Q434]" in result.output and "row 0" in result.output, result.output
    assert not (tmp_path / "out.onnx").exists()


def test_check_and_plan_import_no_dataset_library(tmp_path):
    path = recipe(tmp_path, str(DATA / "chat.jsonl"), f'messages "messages"  tokenizer "{TOKENIZER}"  shuffle')
    # said by an exit handler: a command that imported onnx ends without the interpreter's teardown (cli.main)
    code = ("import atexit, sys; from compiler.cli import main; sys.argv = ['qrc', 'plan', sys.argv[1]]\n"
            "atexit.register(lambda: print(sorted(m for m in ('datasets', 'torch', 'transformers', 'onnxruntime')"
            " if m in sys.modules)))\n"
            "main()")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_chat_jsonl_and_parquet_compile_and_pass_verification(tmp_path, backend):
    for data, options in ((DATA / "chat.jsonl", 'messages "messages"  shuffle  seed 3  rows pack'),
                          (DATA / "corpus.parquet", 'text "text"  rows pad')):
        path = recipe(tmp_path, str(data), f'tokenizer "{TOKENIZER}"  {options}  samples 16  seqlen 32', backend,
                      name=f"{data.stem}.recipe")
        result = runner.invoke(app, ["compile", str(path)])
        assert result.exit_code == 0 and "passed" in result.output, result.output


def peak_mib(path: Path) -> float:
    """The compile's measured peak (its summary) in a fresh process."""
    out = subprocess.run([sys.executable, "-m", "compiler", "compile", str(path)], capture_output=True, text=True,
                         cwd=ROOT, env={**__import__("os").environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.search(r"peak RSS\s*│\s*([0-9.]+) MiB measured", out.stdout)
    assert found, out.stdout
    return float(found.group(1))


@pytest.mark.slow
def test_memory_is_flat_in_the_datasets_size(tmp_path):
    """A chat file 10× larger (shuffled: every row is counted and the picked ones fetched in streaming passes)
    peaks within 5% of the smaller one."""
    lines = (DATA / "chat.jsonl").read_text().splitlines()
    peaks = {}
    for scale in (1, 10):
        big = tmp_path / f"chat-{scale}.jsonl"
        with big.open("w") as handle:
            for i in range(8000 * scale):  # 1.9 MB and 19 MB (above the 1 MiB that streaming parses at once)
                handle.write(lines[i % len(lines)] + "\n")
        peaks[scale] = peak_mib(recipe(tmp_path, str(big), f'messages "messages"  tokenizer "{TOKENIZER}"  shuffle  '
                                       "rows pack  samples 16  seqlen 64", name=f"{scale}.recipe"))
    print(f"peaks (MiB) by file scale: {peaks}")
    assert abs(peaks[10] / peaks[1] - 1) <= 0.05, peaks


@pytest.mark.parametrize("name, content", [("broken.jsonl", '{"text": "a good row of text"}\n{"text": broken\n'),
                                           ("garbage.parquet", "PAR1 not a parquet file"),
                                           ("garbage.arrow", "not an arrow stream")])
def test_corrupt_files_are_a_coded_error_with_nothing_written(tmp_path, name, content):
    bad = tmp_path / name
    bad.write_text(content)
    path = recipe(tmp_path, str(bad), f'tokenizer "{TOKENIZER}"  shuffle  samples 4  seqlen 16')
    result = runner.invoke(app, ["compile", str(path)])
    assert result.exit_code == 2 and "error[Q401]" in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out.onnx").exists()


def test_check_reads_a_saved_folders_metadata_only_to_a_bound(tmp_path):
    """A save_to_disk folder whose dataset_info.json is 3 GiB (sparse here; planted or corrupt elsewhere): `qrc
    check` reads at most its bound of it (16 MiB) and still answers, where it once read the whole file into memory
    to find the features."""
    import tracemalloc

    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a b c"]})}).save_to_disk(str(saved))
    with (saved / "train" / "dataset_info.json").open("r+b") as handle:
        handle.truncate(3 << 30)
    path = recipe(tmp_path, str(saved), f'tokenizer "{TOKENIZER}"')
    tracemalloc.start()
    try:
        result = runner.invoke(app, ["check", str(path)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert peak < 64 << 20, peak


def test_a_tokenizer_config_nested_past_the_parser_is_no_template_not_a_traceback(tmp_path):
    """Chat rows with a tokenizer folder whose tokenizer_config.json is `[[[[…` 100,000 deep and no template file:
    `qrc check` says the tokenizer has no chat template (Q436); the parser's RecursionError had escaped as a
    traceback."""
    import shutil

    folder = tmp_path / "tokenizer"
    folder.mkdir()
    shutil.copy(TOKENIZER / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    path = recipe(tmp_path, str(DATA / "chat.jsonl"), f'messages "messages"  tokenizer "{folder}"')
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 2 and "error[Q436]" in result.output, result.output
