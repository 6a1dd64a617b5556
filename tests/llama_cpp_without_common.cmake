# Included by tests/run.sh's llama-cpp-python build right after llama.cpp's own project() call
# (CMAKE_PROJECT_llama.cpp_INCLUDE): llama-cpp-python forces LLAMA_BUILD_COMMON on, yet loads only libllama and
# libggml*; the common library (argument parsing, chat parsers, JSON) was 53 of the build's 132 compile units and
# half its time (295 s to 150 s on two cores, 2026-12-06), spent beside the slow tests.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama.cpp's common library: llama-cpp-python does not load it" FORCE)
