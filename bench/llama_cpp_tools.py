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


def ggml_rounded(float_file: Path, out: Path, kind: str) -> float:
    """llama.cpp's own rounding of every F32 matrix of `float_file` but the token embedding to the GGUF type `kind`
    (ggml's `ggml_quantize_chunk`, which `llama-quantize` calls for each tensor, from the library llama-cpp-python
    ships), written to `out` with the file's other tensors and key-values as they are: for the types its
    `llama_model_quantize` will not write (NVFP4 in llama-cpp-python 0.3.36). The seconds of the rounding."""
    import ctypes
    import time

    import gguf
    import llama_cpp
    import numpy as np

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    qtype = gguf.GGMLQuantizationType[kind]
    lib.ggml_quantize_init(int(qtype))
    reader = gguf.GGUFReader(float_file)
    writer = gguf.GGUFWriter(out, bytes(reader.fields["general.architecture"].parts[-1]).decode())
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=field.types[-1]
                                 if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    seconds = 0.0
    for tensor in reader.tensors:
        data = np.array(tensor.data)
        if data.ndim == 2 and tensor.name != "token_embd.weight" and tensor.tensor_type == gguf.GGMLQuantizationType.F32:
            rows, columns = data.shape
            weights = np.ascontiguousarray(data, np.float32)
            encoded = np.zeros((rows, columns // block * size), np.uint8)
            start = time.perf_counter()
            written = lib.ggml_quantize_chunk(int(qtype), weights.ctypes.data, encoded.ctypes.data, 0, rows, columns,
                                              None)
            seconds += time.perf_counter() - start
            assert written == encoded.nbytes, (tensor.name, written, encoded.nbytes)
            writer.add_tensor(tensor.name, encoded, raw_shape=encoded.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return seconds


if __name__ == "__main__":
    found = llama_cpp_source()
    print(f"source: {found}\nllama-quantize: {llama_quantize(found)}")
