"""Under torchrun (torch.distributed's launcher, gloo on this CPU) a compile on the torch backend is shared by the
ranks: each runs its share of the sample chunks, the statistics are merged exactly, each block's layers are
rounded on the ranks and the first writes the folder. For every observer method (and rtn, mse, data-free) the
folder is byte for byte what one process writes; GPTQ is deterministic for a rank count and as good as one
process's (KL against float, measured in transformers). Two "nodes" on 127.0.0.1 give the same bytes; a killed
rank stops every rank with Q432 and nothing written, and a relaunch resumes each rank's calibration (ONNX) or
starts after the last block every rank finished (torch, offload).
`qrc check` and `qrc plan` know `memory { ranks N }`."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compiling import ROOT, rank_env

from compiler.frontend import check_source, plan_file
from compiler.plan.render import to_text
from compiler.source import Source

DATA_FREE = 'recipe datafree {\n    model "builtin:tiny-llama"\n    backend torch\n    quantize { type Linear -> W4A16 }\n}\n'

OBSERVED = """recipe shared {{
    model "{model}"
    backend torch
    scheme s = {base} {{ rounding {rounding} }}
    quantize {{ "model.layers.*" -> s  "lm_head" -> {head} }}
    group auto qkv
    calibrate {{ data synthetic {{ samples 24  seqlen 64 }}  chunk 4  method {method} }}
    memory {{ mode {mode}  disk "{disk}" }}
    {kv}
    verify {{ samples 8  metric cosine  at_least 0.9 }}
    emit "{out}" {{ format safetensors }}
}}
"""

GPTQ = """recipe gptq {{
    model "{model}"
    backend torch
    scheme w4 = W4A16 {{ group 32  rounding gptq }}
    quantize {{ type Linear -> w4  "lm_head" -> none }}
    calibrate {{ data synthetic {{ samples 32  seqlen 64 }}  chunk 4 }}
    memory {{ mode low_memory }}
    emit "{out}" {{ format safetensors }}
}}
"""


def _env() -> dict:
    # one thread per process, as torchrun gives each rank: the single process computes with the same kernels
    return rank_env()


def _launcher(ranks: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] \
        if ranks > 1 else [sys.executable]


def _qrc(*args: str, ranks: int = 1, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*_launcher(ranks), "-m", "compiler", *args], capture_output=True, text=True,
                          env={**_env(), **(env or {})}, cwd=ROOT, timeout=600)


def _alone(recipe: Path, out: Path):
    """The one-process reference, compiled in this process (no second start of torch) with one thread, as each
    rank computes."""
    import torch
    from compiling import compile_program

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return compile_program(str(recipe), out)[0]
    finally:
        torch.set_num_threads(threads)


def _same_folders(one: Path, two: Path) -> None:
    files = sorted(p.name for p in one.iterdir())
    assert files == sorted(p.name for p in two.iterdir()) and {"model.safetensors", "m.onnx", "m.gguf"} & set(files)
    for name in files:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name


def _one_and_two(recipe: Path, where: Path, file: str = "") -> subprocess.CompletedProcess:
    """`recipe` compiled alone (into where/one, or where/one/`file` for an ONNX model) and on two ranks
    (where/two), the two folders byte for byte the same, and so is the verified cosine; the ranks' run."""
    alone = _alone(recipe, where / "one" / file)
    run = _qrc("compile", str(recipe), "-o", str(where / "two" / file), ranks=2)
    assert run.returncode == 0, run.stderr[-3000:]
    _same_folders(where / "one", where / "two")
    if alone.verify is not None:  # the same samples, their sums merged: the figure one process prints
        assert f"cosine {alone.verify['cosine']:.4g}" in run.stdout, (alone.verify, run.stdout)
    return run


def _two_ranks_within_a_percent(recipe: Path, where: Path, file: str, what: str, twice: bool = True) -> None:
    """`recipe` compiled alone (where/one/`file`) and on two ranks (where/two; with `twice`, again into
    where/again, and the two ranks' runs write the same bytes): the KL against float they verify is one process's
    within 1%."""
    alone = _alone(recipe, where / "one" / file)
    runs = [_qrc("compile", str(recipe), "-o", str(where / name / file), ranks=2)
            for name in (("two", "again") if twice else ("two",))]
    assert all(run.returncode == 0 for run in runs), runs[0].stderr[-3000:]
    if twice:
        _same_folders(where / "two", where / "again")
    found = re.search(r"kld ([0-9.e-]+)", runs[0].stdout.replace("\n", " "))
    assert found is not None, runs[0].stdout[-2000:]
    one, two = alone.verify["kld"], float(found.group(1))
    print(f"{what}: one process {one:.6f}, two ranks {two:.6f}")
    assert 0 < one and abs(two - one) <= 0.01 * one, (one, two)


@pytest.mark.slow
def test_two_ranks_write_the_bytes_one_process_writes(tmp_path):
    recipe = tmp_path / "r.recipe"
    recipe.write_text(DATA_FREE)
    two = _one_and_two(recipe, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "r.recipe", "two"]  # no rank left anything
    assert two.stdout.count("compiled datafree") == 1  # the first rank speaks for all


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from zoo import build

    return build("llama", tmp_path_factory.mktemp("ranks") / "llama")


@pytest.mark.slow
@pytest.mark.parametrize("method, mode, rounding, base", [
    ("minmax", "full", "rtn", "W8A8_STATIC"), ("entropy", "offload", "mse", "W8A8_STATIC"),
    ("layerwise_percentile", "low_memory", "rtn", "W8A8_STATIC"), ("mse", "offload", "rtn", "hf FP8")])
def test_every_observer_method_writes_one_process_bytes(tmp_path, llama, method, mode, rounding, base):
    """Observers merge exactly over the ranks (min/max and the histograms), and chunk i runs on rank i mod 2
    exactly as it runs alone: the scales, hence every byte, are one process's. The HF cases add the FP8 KV
    cache (its ranges are maxima over the ranks), transformers' own load check on the first rank and, for
    FP8, compressed-tensors' rounding on the rank that owns each layer."""
    hf = base.startswith("hf ")
    recipe = tmp_path / "r.recipe"  # one recipe: the output carries its text
    recipe.write_text(OBSERVED.format(model=llama if hf else "builtin:tiny-llama", rounding=rounding, method=method,
                                      mode=mode, disk=tmp_path / "cache", out=tmp_path / "out",
                                      base=base.removeprefix("hf "), head="none" if hf else "W8A16",
                                      kv="kv_cache { fp8 }" if hf else ""))
    run = _one_and_two(recipe, tmp_path)
    assert "shared by 2 torchrun ranks" in run.stdout and "rank 1" in run.stdout  # the per-rank peaks
    if hf:  # each rank ran its held-out chunks through the folder the first rank staged, as transformers loads it
        assert "measured on the emitted folder" in " ".join(run.stdout.split()), run.stdout


def _kl(float_folder: Path, out: Path) -> float:
    """Mean KL(float ‖ quantized) over held-out random ids, both loaded by transformers (the output through
    compressed-tensors, as its users load it)."""
    import torch
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, 320, (4, 48), generator=torch.Generator().manual_seed(1234))
    with torch.no_grad():
        p = AutoModelForCausalLM.from_pretrained(float_folder).eval()(ids).logits.log_softmax(-1)
        q = AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits.log_softmax(-1)
    return float((p.exp() * (p - q)).sum(-1).mean())


@pytest.mark.slow
def test_gptq_over_ranks_is_deterministic_and_as_good_as_one_process(tmp_path, llama):
    """The Hessians are summed in float64 in rank order and each layer is rounded on the rank it is assigned
    to: two runs on 2 ranks write the same bytes, and their KL against float is one process's within 1%."""
    outs = {}
    recipe = tmp_path / "r.recipe"
    recipe.write_text(GPTQ.format(model=llama, out=tmp_path / "out"))
    outs = {name: tmp_path / name for name in ("one", "two", "again")}
    _alone(recipe, outs["one"])
    for name in ("two", "again"):
        run = _qrc("compile", str(recipe), "-o", str(outs[name]), ranks=2)
        assert run.returncode == 0, run.stderr[-3000:]
    _same_folders(outs["two"], outs["again"])
    one, two = _kl(llama, outs["one"]), _kl(llama, outs["two"])
    print(f"GPTQ KL against float in transformers: one process {one:.6f}, two ranks {two:.6f}")
    assert 0 < one and abs(two - one) <= 0.01 * one, (one, two)


TRANSFORM = """recipe smoothed {{
    model "{model}"
    backend {backend}
    transform {transform}
    scheme s = {scheme}
    quantize {{ type Linear -> s  "lm_head" -> none }}
    group auto
    calibrate {{ data synthetic {{ samples 16  seqlen 64 }}  chunk 4 }}
    memory {{ mode {mode} }}
    {verify}
    emit "{out}" {{ format {format} }}
}}
"""


def _transformed(model: str, transform: str, scheme: str, mode: str, out: Path, backend: str = "torch") -> str:
    """TRANSFORM on the torch backend (a safetensors folder), or on ONNX (QDQ, verified: the figure the ranks
    share)."""
    onnx = backend == "onnx"
    return TRANSFORM.format(model=model, backend=backend, transform=transform, scheme=scheme, mode=mode, out=out,
                            verify="verify { samples 8  metric kld  at_most 1.0 }" if onnx else "",
                            format="qdq" if onnx else "safetensors")


GGUF = """recipe gguf_shared {{
    model "{model}"
    backend torch
    scheme q4 {{ weights int4 group 32 symmetric  rounding {rounding} }}
    scheme q8 {{ weights int8 group 32 symmetric }}
    quantize {{ type Linear -> q4  "*.mlp.down_proj", "lm_head" -> q8 }}
    {data}
    emit "{out}" {{ format gguf }}
}}
"""
CALIBRATED = "calibrate { data synthetic { samples 24  seqlen 32 }  chunk 4 }\n    verify { samples 8  metric kld  at_most 0.05 }"


@pytest.fixture(scope="module")
def tokenized_llama(tmp_path_factory) -> Path:
    from zoo import add_tokenizer, build

    return add_tokenizer(build("llama", tmp_path_factory.mktemp("ranks-gguf") / "llama"), 320)


@pytest.mark.slow
# rtn calibrated is not a case: rtn's GGUF blocks do not depend on the data, and the block-wise path with
# verification is the GPTQ case's (CI time: each torchrun launch is about 20 s of CPU before any work)
@pytest.mark.parametrize("rounding, data", [("rtn", ""), ("gptq", CALIBRATED)])
def test_gguf_over_ranks(tmp_path, tokenized_llama, rounding, data):
    """`format gguf` under torchrun: each rank rounds its share of the layers (file to file, or a block's layers
    after the merged statistics) and encodes them in GGUF's blocks, and the first rank writes every tensor where
    the layout puts it. rtn (llama.cpp's reference rounding of Q4_0 and Q8_0) gives one process's bytes; GPTQ's KL,
    block by block with verification, is one process's within 1% (until 2026-11-27, refused with Q431). Its
    determinism over ranks is the torch GPTQ test's: the same sums, merged by the same code."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(GGUF.format(model=tokenized_llama, rounding=rounding, data=data, out=tmp_path / "x.gguf"))
    if rounding == "rtn":
        _one_and_two(recipe, tmp_path, "m.gguf")
        return
    _two_ranks_within_a_percent(recipe, tmp_path, "m.gguf", "GGUF GPTQ KL against float", twice=False)


@pytest.mark.slow
def test_smoothquant_over_ranks_writes_one_process_bytes(tmp_path):
    """SmoothQuant's scales come from each channel's maximum, which merges exactly over the ranks."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(_transformed("builtin:tiny-llama", "smoothquant { alpha 0.5 }", "W8A8_STATIC { rounding rtn }",
                                   "low_memory", tmp_path / "x"))
    _one_and_two(recipe, tmp_path)


@pytest.mark.slow
def test_awq_over_ranks_is_as_good_as_one_process(tmp_path, llama):
    """AWQ's search reads the channels' sums and XᵀX, added over the ranks in rank order (share_sums, whose
    determinism the GPTQ test shows with two launches): the two ranks' KL against float (transformers) is one
    process's within 1%."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(_transformed(llama, "awq { grid 20  duo_scaling }", "W4A16 { group 32 }", "offload",
                                   tmp_path / "x"))
    _alone(recipe, tmp_path / "one")
    run = _qrc("compile", str(recipe), "-o", str(tmp_path / "two"), ranks=2)
    assert run.returncode == 0, run.stderr[-3000:]
    one, two = _kl(llama, tmp_path / "one"), _kl(llama, tmp_path / "two")
    print(f"AWQ KL against float in transformers: one process {one:.6f}, two ranks {two:.6f}")
    assert 0 < one and abs(two - one) <= 0.01 * one, (one, two)


@pytest.mark.slow
# torch's mse is not a case: its Gram matrices merge in share_sums as kld's gradients do (float64 where kld's stay
# float32), and GPTQ's Hessians are input Gram matrices merged over ranks in test_gptq_over_ranks…
@pytest.mark.parametrize("example, metric", [("tiny-llama-torch-mixed", "kld"), ("tiny-llama-mixed", "kld"),
                                             ("tiny-llama-mixed", "mse")])
def test_the_mixed_precision_search_over_ranks_chooses_what_one_process_chooses(tmp_path, example, metric):
    """The search's data (torch: the gradients of kld; ONNX: each unit's measured KL sums; both: the input Gram
    matrices of mse) is each rank's share of the scoring chunks, summed over the ranks in rank order; every rank
    then chooses the same units to promote, and they are one process's: the weights (rtn, data-free once chosen)
    are byte for byte one process's."""
    text = (ROOT / f"recipes/{example}.recipe").read_text()
    emit = re.search(r'emit "([^"]+)"', text)
    assert emit is not None
    name = Path(emit.group(1)).name
    text = text.replace("metric kld", f"metric {metric}", 1).replace(
        emit.group(0), f'memory {{ disk "{tmp_path / "cache"}" }}\n    emit "{tmp_path / name}"')
    recipe = tmp_path / "r.recipe"
    recipe.write_text(text)
    run = _one_and_two(recipe, tmp_path, "m.onnx" if name.endswith(".onnx") else "")
    assert "w8" in run.stdout and "w4" in run.stdout  # the search promoted some units, not all
    assert len(list((tmp_path / "cache" / "sensitivity").glob("*.json"))) == 2  # each scored: its own cache key


ONNX = """recipe onnx_shared {{
    model "builtin:tiny-llama"
    backend onnx
    scheme s = {base} {{ rounding {rounding} }}
    quantize {{ "*" -> s  "lm_head" -> W8A16  re"model\\.embed_tokens" -> none }}
    group auto qkv
    calibrate {{ data synthetic {{ samples 24  seqlen 64 }}  chunk 4  method {method} }}
    memory {{ mode {mode} }}
    verify {{ samples 8  metric cosine  at_least 0.5 }}
    emit "{out}" {{ format qdq }}
}}
"""


@pytest.mark.slow
# the calibration methods are plug-ins both backends share (quant/methods), merged over the ranks as their
# observers say (min/max or a histogram): here each observer kind and each memory mode on ONNX's calibration loop;
# the mse and layerwise_percentile methods' merges over ranks are test_every_observer_method_writes_one_process_bytes's
# GPTQ's Hessian merge once, in offload (block by block), where full mode merges them the same way
@pytest.mark.parametrize("method, mode, base, rounding", [
    ("minmax", "full", "W8A8_STATIC", "rtn"), ("percentile 99.9", "low_memory", "W8A8_STATIC", "mse"),
    ("entropy", "offload", "W8A8_STATIC", "rtn"), ("minmax", "offload", "W4A16", "gptq")])
def test_onnx_ranks_merge_observers_and_round_weights_n_at_a_time(tmp_path, method, mode, base, rounding):
    """ONNX: the calibration chunks split over the ranks and the observers merged exactly give one process's
    bytes; GPTQ's Hessians (float64 sums, merged in rank order) give a model whose KL against float, as
    onnxruntime runs the emitted file, is one process's within 1%."""
    import torch
    from compiling import compile_program

    recipe = tmp_path / "r.recipe"
    recipe.write_text(ONNX.format(base=base, rounding=rounding, method=method, mode=mode, out=tmp_path / "x.onnx"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result, _ = compile_program(str(recipe), tmp_path / "one" / "m.onnx")
    finally:
        torch.set_num_threads(threads)
    run = _qrc("compile", str(recipe), "-o", str(tmp_path / "two" / "m.onnx"), ranks=2)
    assert run.returncode == 0, run.stderr[-3000:]
    if rounding != "gptq":
        _same_folders(tmp_path / "one", tmp_path / "two")
        return
    found = re.search(r"kld ([0-9.e-]+)", run.stdout.replace("\n", " "))
    assert found is not None, run.stdout[-2000:]
    one, two = result.verify["kld"], float(found.group(1))
    print(f"ONNX GPTQ KL against float in onnxruntime: one process {one:.6f}, two ranks {two:.6f}")
    assert 0 < one and abs(two - one) <= 0.01 * one, (one, two)


FOLDER_ON_ONNX = """recipe exported {{
    model "{model}"
    backend onnx
    quantize {{ type Linear -> W8A8_STATIC  "lm_head" -> none }}
    calibrate {{ data synthetic {{ samples 16  seqlen 32 }}  chunk 4  method minmax }}
    emit "{out}" {{ format qdq }}
}}
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "offload"])  # low_memory calibrates through full's loop
def test_onnx_smoothquant_over_ranks_writes_one_process_bytes(tmp_path, mode):
    """ONNX SmoothQuant under torchrun: each rank observes the norms' outputs on its chunks, the maxima merge
    exactly, and every rank folds the same copy: one process's bytes (until 2026-11-27, refused with Q431)."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(_transformed("builtin:tiny-llama", "smoothquant { alpha 0.5 }", "W8A8_STATIC", mode,
                                   tmp_path / "x.onnx", backend="onnx"))
    _one_and_two(recipe, tmp_path, "m.onnx")


@pytest.mark.slow
def test_onnx_awq_over_ranks_is_deterministic_and_as_good_as_one_process(tmp_path):
    """ONNX AWQ under torchrun: the channels' sums and XᵀX are added over the ranks in rank order, so two runs on
    two ranks write the same bytes, and the KL against float that onnxruntime measures on the emitted file is one
    process's within 1%."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(_transformed("builtin:tiny-llama", "awq { grid 20  duo_scaling }", "W4A16 { group 32 }", "full",
                                   tmp_path / "x.onnx", backend="onnx"))
    _two_ranks_within_a_percent(recipe, tmp_path, "m.onnx", "ONNX AWQ KL against float in onnxruntime")


@pytest.mark.slow
def test_an_hf_folder_is_exported_once_per_machine_and_its_onnx_compile_shared(tmp_path, llama, monkeypatch):
    """An HF folder on the ONNX backend under torchrun: the first rank of the machine exports it into the cache
    while the other waits, then both compile the cached graph, sharing the calibration: one process's bytes
    (that one process takes the same cache entry: one export in all). The folder has a tokenizer, so the export
    is onnxruntime-genai's builder's (8 s, where the dynamo exporter takes 20 s); either is made once."""
    import shutil

    from zoo import add_tokenizer

    folder = add_tokenizer(Path(shutil.copytree(llama, tmp_path / "llama")), 320)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(FOLDER_ON_ONNX.format(model=folder, out=tmp_path / "x.onnx"))
    cache = tmp_path / "cache"
    run = _qrc("compile", str(recipe), "-o", str(tmp_path / "two" / "m.onnx"), ranks=2, env={"QRC_CACHE": str(cache)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(list((cache / "exported").iterdir())) == 1 and not list(cache.glob("**/*.tmp"))
    monkeypatch.setenv("QRC_CACHE", str(cache))
    alone = _alone(recipe, tmp_path / "one" / "m.onnx")
    assert "export_onnx" in alone.skipped  # the cached entry the ranks wrote
    _same_folders(tmp_path / "one", tmp_path / "two")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_two_nodes_on_one_host_write_one_process_bytes(tmp_path, backend, llama):
    """`torchrun --nnodes 2`: two launchers meet at a rendezvous on 127.0.0.1, one rank each, as two machines
    would; the output is one process's, written by the first node's rank alone. The second node verifies its
    share of the held-out samples on a copy of the staged output the first sends it: the printed figure is
    one process's, measured on the emitted model."""
    recipe = tmp_path / "r.recipe"
    if backend == "torch":
        recipe.write_text(OBSERVED.format(model=llama, rounding="rtn", method="entropy", base="W8A8_STATIC", head="W8A16",
                                          mode="low_memory", disk=tmp_path / "cache", out=tmp_path / "x", kv=""))
    else:
        recipe.write_text(ONNX.format(base="W8A8_STATIC", rounding="rtn", method="entropy", mode="full", out=tmp_path / "x"))
    file = "m.onnx" if backend == "onnx" else ""
    alone = _alone(recipe, tmp_path / "one" / file)
    port = _free_port()
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", f"--node_rank={rank}",
         "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=qrc-test", "-m", "compiler",
         "compile", str(recipe), "-o", str(tmp_path / "two" / file)], env={**_env(), "COLUMNS": "250"}, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [node.communicate(timeout=600) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][1][-2000:] + outputs[1][1][-2000:]
    _same_folders(tmp_path / "one", tmp_path / "two")
    summary = " ".join(outputs[0][0].replace("│", " ").split())  # the summary table's cells, unwrapped
    assert f"cosine {alone.verify['cosine']:.4g}" in summary, (alone.verify, summary)
    assert "qrc's model" not in summary and "shared by 2 torchrun ranks" in summary, summary


def _rank_pid(rank: int, marker: str) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and marker.encode() in cmdline and b"compiler" in cmdline:
            return int(entry.name)
    return None


RESUMABLE = """recipe long {{
    model "builtin:tiny-llama?layers=8&hidden=256&heads=4&kv_heads=2&vocab=8192&intermediate=768"
    backend onnx
    quantize {{ "*" -> W8A8_STATIC  "lm_head" -> W8A16  re"model\\.embed_tokens" -> none }}
    calibrate {{ data synthetic {{ samples 48  seqlen 128 }}  chunk 2  method entropy }}
    memory {{ mode {mode}  disk "{disk}" }}
    emit "{out}" {{ format qdq }}
}}
"""


@pytest.mark.slow
# offload only: its resume (each rank's observers and the block boundary values) is full mode's and more; full
# mode's resume after a kill is test_calibration.py's test_resume_after_kill_gives_identical_bytes (one process)
@pytest.mark.parametrize("mode", ["offload"])
def test_a_killed_rank_stops_every_rank_and_a_relaunch_resumes(tmp_path, mode):
    """Rank 1 is killed (SIGKILL) while the ranks calibrate: rank 0 stops within seconds with Q432 naming
    rank 1, and the destination never appears. Each rank saved its own share's observers after every chunk
    (offload: after every block, its boundary values kept on disk), so the same launch again resumes each rank
    where it stopped, and writes one process's bytes."""
    from compiler.backends.onnx.resume import ResumeState

    disk, out = tmp_path / "cache", tmp_path / "out" / "m.onnx"
    recipe = tmp_path / "long.recipe"
    recipe.write_text(RESUMABLE.format(disk=disk, out=out, mode=mode))
    launch = subprocess.Popen([*_launcher(2), "-m", "compiler", "compile", str(recipe)], env=_env(), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and launch.poll() is None:  # both ranks have finished a chunk
        if len(list(disk.glob("checkpoints/calibration-*.npz"))) >= 2:
            break
        time.sleep(0.1)
    victim = _rank_pid(1, str(recipe))
    assert victim is not None and launch.poll() is None, launch.communicate()[1][-2000:]
    os.kill(victim, 9)
    killed = time.monotonic()
    _, stderr = launch.communicate(timeout=300)
    assert launch.returncode != 0 and time.monotonic() - killed < 120
    assert "error[Q432]" in stderr and f"rank 1 (process {victim})" in stderr, stderr[-3000:]
    assert not out.parent.exists() or not any(out.parent.iterdir())  # nothing written, nothing staged left
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "out") == ["cache", "long.recipe"]
    saved = [ResumeState(path).load() for path in disk.glob("checkpoints/calibration-*.npz")]
    assert len(saved) == 2 and all(state is not None and state[0] > 0 for state in saved)  # chunks done, each rank

    again = _qrc("compile", str(recipe), ranks=2)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not any(disk.glob("checkpoints/calibration-*.npz"))  # a finished calibration leaves no state
    _alone(recipe, tmp_path / "one" / "m.onnx")
    _same_folders(tmp_path / "one", out.parent)


TORCH_RESUMABLE = """recipe resumable {{
    model "{model}"
    backend torch
    scheme w4 {{ weights int4 group 32 symmetric  rounding {rounding} }}
    quantize {{ type Linear -> w4  "lm_head" -> none }}
    calibrate {{ data synthetic {{ samples 16  seqlen 128 }}  chunk 4 }}
    memory {{ mode offload  disk "{disk}" }}
    verify {{ samples 8  metric kld  at_most 0.5 }}
    emit "{out}" {{ format {format} }}
}}
"""
# eight blocks small enough that a compile takes about 10 s (each block about 0.4 s of GPTQ, so the kill lands
# between blocks 3 and 8 with seconds to spare), where hidden 512 and a 32,000 vocabulary took 22 s
EIGHT_BLOCKS = "builtin:tiny-llama?layers=8&hidden=256&heads=4&kv_heads=2&vocab=8192&intermediate=768"


@pytest.fixture(scope="module")
def eight_blocks_tokenized(tmp_path_factory) -> Path:
    """A random Llama of 8 blocks (hidden 256, as EIGHT_BLOCKS) with a tokenizer: what a GGUF file needs."""
    from zoo import tokenized_llama

    return tokenized_llama(tmp_path_factory.mktemp("resume-gguf") / "llama", 8, hidden=256)


def _finished_blocks(disk: Path) -> list[int]:
    """How many blocks each saved torch resume state (one per rank) says were finished."""
    import json

    found = []
    for path in disk.glob("checkpoints/blocks-*/state.json"):
        try:
            found.append(json.loads(path.read_text())["done"])
        except (OSError, ValueError):  # being replaced just now
            pass
    return found


@pytest.mark.slow
# one process and a folder: the autoround case (GPTQ's one-process resume is the GGUF case's)
@pytest.mark.parametrize("ranks, format, rounding", [(2, "safetensors", "gptq"), (1, "gguf", "gptq"),
                                                     (1, "safetensors", "autoround { iters 12  batch 4 }")],
                         ids=["2-safetensors", "1-gguf", "1-safetensors-autoround"])
def test_a_killed_torch_compile_resumes_after_its_last_finished_block(tmp_path, request, ranks, format, rounding):
    """GPTQ in offload with `disk` on torch, killed (SIGKILL: no clean-up at all; under torchrun, rank 1) once every
    rank recorded three finished blocks: nothing appears at the destination, and the same launch again starts at
    block 4 from the hidden states the killed run left, and writes the bytes an uninterrupted run writes (GPTQ
    rounds each block from the quantized outputs of the blocks before, so those states must be exact; learned
    rounding learns on them). The state and the staged output (a folder, or the GGUF file) go once the output is in
    place."""
    gguf = format == "gguf"
    disk, out = tmp_path / "cache", tmp_path / "out" / "m.gguf" if gguf else tmp_path / "out"
    model = request.getfixturevalue("eight_blocks_tokenized") if gguf else EIGHT_BLOCKS
    recipe = tmp_path / "r.recipe"
    recipe.write_text(TORCH_RESUMABLE.format(model=model, disk=disk, out=out, format=format, rounding=rounding))
    reference = tmp_path / "one" / out.name if gguf else tmp_path / "one"
    if ranks == 1:
        _alone(recipe, reference)
    else:
        launched = _qrc("compile", str(recipe), "-o", str(reference), ranks=2)
        assert launched.returncode == 0, launched.stderr[-3000:]
    assert not any(disk.glob("checkpoints/blocks-*"))  # a finished compile leaves no state
    launch = subprocess.Popen([*_launcher(ranks), "-m", "compiler", "compile", str(recipe)], env=_env(), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and launch.poll() is None:
        done = _finished_blocks(disk)
        if len(done) == ranks and min(done) >= 3:
            break
        time.sleep(0.1)
    victim = _rank_pid(1, str(recipe)) if ranks == 2 else launch.pid
    assert victim is not None and launch.poll() is None, launch.communicate()[1][-2000:]
    os.kill(victim, 9)
    launch.communicate(timeout=300)
    assert launch.returncode != 0 and not out.exists()
    assert min(_finished_blocks(disk)) >= 3 and any(out.parent.glob(f".{out.name}.qrc-resume-*"))
    again = _qrc("compile", str(recipe), ranks=ranks, env={"COLUMNS": "250"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"resumed after block [3-8] of 8", again.stdout), again.stdout[-3000:]
    _same_folders(tmp_path / "one", out.parent if gguf else out)
    assert not any(disk.glob("checkpoints/blocks-*")) and not any(out.parent.glob(f".{out.name}.qrc-*"))


def test_a_torch_resume_state_that_is_not_one_is_ignored(tmp_path):
    """A state file that is not a state (foreign, damaged, another version) or names hidden states that are gone:
    Q408, the run starts over, and the folder is emptied for the state it will save."""
    from compiler.backends.ranks import Ranks
    from compiler.backends.torch.resume import BlockResume

    identity = ("recipe", "model", "out")
    first = BlockResume.open(tmp_path, tmp_path / "out", identity, Ranks(), None, [])
    state = first.folder / "state.json"
    for text in ("not json", '{"format": "qrc-torch-blocks-v0", "done": 2}',
                 '{"format": "qrc-torch-blocks-v1", "done": 2, "caches": {"calibration": "gone"}, "finished": {}}',
                 '{"format": "qrc-torch-blocks-v1", "done": -1, "caches": {}, "finished": {}}',
                 # tampered: more blocks done than the model has (was a "21 tensors were never written" traceback)
                 '{"format": "qrc-torch-blocks-v1", "done": 1000000, "caches": {}, "finished": {}}'):
        state.write_text(text)
        first.staged.mkdir(exist_ok=True)
        warnings: list = []
        again = BlockResume.open(tmp_path, tmp_path / "out", identity, Ranks(), None, warnings, blocks=8)
        assert again.start == 0 and [w.code for w in warnings] == ["Q408"], (text, warnings)
        assert not state.exists() and not first.staged.exists()


def test_a_new_recipe_into_the_same_destination_removes_what_a_killed_one_left(tmp_path):
    """The hidden states and the staged output of a killed run are removed when a run with another recipe (or
    model, or rank count) writes to the same destination: they could never be resumed. Another destination's
    stay."""
    from compiler.backends.ranks import Ranks
    from compiler.backends.torch.resume import BlockResume

    old = BlockResume.open(tmp_path, tmp_path / "out", ("recipe 1", "model", "out"), Ranks(), None, [])
    elsewhere = BlockResume.open(tmp_path, tmp_path / "other", ("recipe 1", "model", "other"), Ranks(), None, [])
    for resume in (old, elsewhere):
        resume.staged.mkdir()
        (resume.folder / "qrc-hidden-x").mkdir()
    new = BlockResume.open(tmp_path, tmp_path / "out", ("recipe 2", "model", "out"), Ranks(), None, [])
    assert not old.folder.exists() and not old.staged.exists()
    assert elsewhere.folder.exists() and elsewhere.staged.exists() and new.folder.exists()


# ---- `memory { ranks N }` in check and plan (no launch) ---------------------------------------------------

def test_plan_shows_each_ranks_share_and_peak():
    plan = plan_file(ROOT / "recipes/tiny-llama-torch-gptq.recipe", ("memory.ranks=2",), detected_free=8 << 30)
    one = plan_file(ROOT / "recipes/tiny-llama-torch-gptq.recipe", (), detected_free=8 << 30)
    assert plan.ok and one.ok and plan.plan is not None and one.plan is not None
    text = to_text(plan.plan)
    assert "ranks    2 torchrun processes" in text and "the 2 ranks' Hessians while they merge" in text
    assert "samples=16" in text and "samples=32" in to_text(one.plan)  # 8 chunks of 4: 4 per rank
    assert "ranks 2" in plan.plan.recipe_text and "ranks" not in one.plan.recipe_text


@pytest.mark.parametrize("backend, scheme, memory, emit, what", [
    ("torch", "W8A8_STATIC", "mode multi_gpu  vram 2 x 80 GiB", "", "mode multi_gpu")])
def test_check_refuses_what_the_ranks_cannot_share(backend, scheme, memory, emit, what):
    text = f'recipe r {{\n    model "builtin:tiny-llama"\n    backend {backend}\n    scheme g = W4A16 {{ group 32 }}\n' \
           f'    quantize {{ type Linear -> {scheme} }}\n    memory {{ {memory}  ranks 2 }}\n    {emit}\n}}\n'
    result = check_source(Source("r.recipe", text))
    q431 = [d for d in result.diagnostics if d.code == "Q431"]
    assert len(q431) == 1 and what in q431[0].message and q431[0].span is not None and q431[0].help, result.diagnostics
    alone = check_source(Source("r.recipe", text.replace("ranks 2", "")))
    assert not any(d.code == "Q431" for d in alone.diagnostics)


def test_ranks_must_be_a_whole_number_of_processes():
    text = 'recipe r {\n    model "builtin:tiny-llama"\n    quantize { type Linear -> W8A16 }\n    memory { ranks 0 }\n}\n'
    result = check_source(Source("r.recipe", text))
    assert not result.ok and any("ranks" in d.message for d in result.diagnostics), result.diagnostics


@pytest.mark.parametrize("gpus, local_world, backend", [
    (0, 2, "gloo"),  # a CPU machine
    (1, 2, "gloo"),  # two ranks, one GPU: nccl would refuse two ranks on one device
    (2, 2, "nccl"),  # a GPU each
    (8, 4, "nccl"),
])
def test_the_process_group_uses_nccl_only_where_each_rank_has_a_gpu(gpus, local_world, backend):
    from compiler.backends.ranks import group_backend

    assert group_backend(gpus, local_world) == backend


@pytest.mark.slow  # seconds each (tests/run.sh keeps the quick loop under 3 minutes)
def test_ranks_given_different_recipes_stop_together_with_q446(tmp_path):
    """A launch script that picks the recipe by RANK: each rank would plan another run (rank 0 met the other's
    tensors in its writer: a ValueError traceback; rank 1 blamed rank 0 with Q432). Now Q446, nothing written."""
    out = tmp_path / "out"
    recipes = []
    for rank, scheme in enumerate(("W8A8_STATIC", "W8A16")):
        path = tmp_path / f"r{rank}.recipe"
        path.write_text((ROOT / "recipes/tiny-llama-torch-w8a8.recipe").read_text()
                        .replace('"model.layers.*"   -> W8A8_STATIC', f'"model.layers.*"   -> {scheme}'))
        recipes.append(path)
    script = tmp_path / "pick.py"
    script.write_text("import os, sys\nfrom compiler.cli import main\n"
                      f"sys.argv = ['qrc', 'compile', {str(tmp_path)!r} + f'/r{{os.environ[\"RANK\"]}}.recipe', "
                      f"'-o', {str(out)!r}]\nmain()\n")
    launched = subprocess.run([*_launcher(2), str(script)], capture_output=True, text=True, env=_env(), cwd=ROOT,
                              timeout=600)
    assert launched.returncode != 0 and "Q446" in launched.stderr, launched.stderr[-3000:]
    # torchrun itself reports a failed child with a traceback of its own; none comes from qrc's code
    assert "compiler/" not in launched.stderr and "Q432" not in launched.stderr, launched.stderr[-3000:]
    assert not out.exists()


@pytest.mark.slow  # two torchrun launches: about 10 s
@pytest.mark.parametrize("planted, kind", [("lock", "link_to_file"), ("report", "dangling_link")])  # FIFOs and the
# other kinds: one process, tests/test_hostile_writes.py (each launch here costs two interpreters with torch)
def test_under_torchrun_a_link_or_fifo_where_qrc_writes_is_refused_and_its_target_untouched(tmp_path, planted, kind):
    """The hostile-writes property (tests/test_hostile_writes.py) with two ranks: the lock the first rank takes and
    the report it writes, planted as a link or a FIFO, stop every rank with a code; the link's target is
    untouched, and a dangling link creates nothing where it points."""
    from test_hostile_writes import _plant, _snapshot, _victims

    victims = _victims(tmp_path)
    recipe, out, report = tmp_path / "r.recipe", tmp_path / "out" / "model", tmp_path / "report.html"
    recipe.write_text(DATA_FREE)
    _plant(out.with_name(".model.qrc-lock") if planted == "lock" else report, kind, victims)
    before = _snapshot(tmp_path)
    launched = _qrc("compile", str(recipe), "-o", str(out), "--report", str(report), ranks=2)
    assert launched.returncode != 0, launched.stdout[-2000:]
    said = launched.stdout + launched.stderr
    assert ("Q441" if planted == "lock" else "Q239") in said and "compiler/" not in launched.stderr, said[-3000:]
    # every rank stopped on its own: none left waiting for torchrun's SIGKILL, 30 s after its SIGTERM (the lock
    # was taken before the ranks joined, and rank 1 waited in the rendezvous for the refused rank 0)
    assert "forcefully exiting via 9" not in said, said[-3000:]
    assert _snapshot(tmp_path) == before


@pytest.mark.slow  # a process with torch: about 4 s
def test_a_rank_waiting_for_the_others_to_join_ends_at_once_on_sigterm(tmp_path):
    """A rank whose peers never join (one died first: out of memory, killed, its node without the model) waits in
    torch's rendezvous, C++ where a Python handler only runs once it returns. torchrun stops it with SIGTERM and
    sent SIGKILL 30 s later; the rank now ends on the SIGTERM itself, having written nothing (the destination's
    lock is taken after the ranks join). Run as torchrun starts rank 0 of 2, with no rank 1."""
    out = tmp_path / "out"
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    backend torch\n'
                      f'    quantize {{ type Linear -> W8A16 }}\n    emit "{out}"\n}}\n')
    port = _free_port()
    env = {**_env(), "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    rank = subprocess.Popen([sys.executable, "-m", "compiler", "compile", str(recipe)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and rank.poll() is None:  # rank 0 hosts the rendezvous' store: it is joining
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    time.sleep(1.0)
    assert rank.poll() is None, rank.communicate()[1][-2000:]
    rank.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    try:
        rank.communicate(timeout=10)
    finally:
        rank.kill()
    assert rank.returncode != 0 and time.monotonic() - stopped < 10
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["r.recipe"]
