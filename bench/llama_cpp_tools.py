"""llama.cpp's own tools for the GGUF benches, found or made once from a fresh clone: the source of the
llama-cpp-python release installed (its sdist's vendor/llama.cpp: `convert_hf_to_gguf.py` and the `gguf-py` it
imports; converting needs `sentencepiece` and `gguf`, the `llama` extra brings both), and the `llama-quantize` tool
built from that source with cmake (llama-cpp-python's wheel build leaves the tools out). Both are kept under
$QRC_CACHE/bench/, so the first bench run downloads the sdist (pip) and builds the tool (a few minutes on 2 cores)
and later runs reuse them.

    python bench/llama_cpp_tools.py          # prints the source folder and the tool, making what is missing
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

# the build of bench/gguf_llama_cpp.py's tool: for AVX-512 and VNNI, not for the building machine (tests/run.sh
# says why: a native build crashed on an AMX CPU)
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=OFF",
               "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_AVX512=ON",
               "-DGGML_AVX512_VNNI=ON")


def _cache() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from compiler.models.builtin import cache_dir

    return cache_dir() / "bench"


def llama_cpp_source() -> Path:
    """vendor/llama.cpp of the installed llama-cpp-python's sdist (downloaded by pip once, then cached)."""
    release = version("llama-cpp-python")
    source = _cache() / f"llama.cpp-{release}"
    if (source / "convert_hf_to_gguf.py").is_file():
        return source
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-q",
                        f"llama-cpp-python=={release}", "-d", tmp], check=True)
        archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
        vendor = next(unpacked.glob("llama_cpp_python-*/vendor/llama.cpp"))
        source.parent.mkdir(parents=True, exist_ok=True)
        os.replace(vendor, source)
    return source


def llama_quantize(source: Path | None = None) -> Path:
    """The `llama-quantize` tool built from `source` (the cached llama.cpp source by default), once."""
    source = source or llama_cpp_source()
    build = source / "build-tools"
    tool = build / "bin" / "llama-quantize"
    if tool.is_file():
        return tool
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-quantize", "-j", str(os.cpu_count() or 2)],
                   check=True, capture_output=True)
    return tool


if __name__ == "__main__":
    found = llama_cpp_source()
    print(f"source: {found}\nllama-quantize: {llama_quantize(found)}")
