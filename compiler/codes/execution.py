"""Diagnostic codes, Q3xx and Q4xx: the plan and its memory, then the backends as they run (models, data files, outputs, ranks)."""

from __future__ import annotations

from compiler.codes.info import CodeInfo

EXECUTION: tuple[CodeInfo, ...] = (
    CodeInfo("Q301", "the plan does not fit the memory budget",
             "qrc estimates the peak memory of every mode before any work starts. An explicit mode, or every "
             "mode under `auto`, that exceeds the budget (`ram`, or 85% of free memory) is refused instead of "
             "running out of memory an hour into calibration. The help names a way out that does fit: a "
             "smaller `chunk`, `mode offload`, or a `disk` cache; or, when even one sample cannot fit, the "
             "tensor that is too large.",
             "memory { mode full  ram 1 GiB }   # on a model whose weights alone exceed 1 GiB"),
    CodeInfo("Q302", "the run went above its ram budget",
             "With `ram` in the recipe, qrc samples its own resident memory while it compiles and stops (writing "
             "nothing) the moment it is above the budget, instead of overrunning it. The plan's estimate is within "
             "±25% of what runs; a model that measures above it needs more `ram`, a smaller `chunk`, or offload.",
             'memory { ram 600 MiB }   # a compile whose real peak is 700 MiB'),
    CodeInfo("Q400", "backend dependency not installed",
             "The torch backend opens HF-style folders with transformers, and the ONNX backend exports them with "
             "torch.onnx (decoders through its dynamo exporter, which needs onnxscript): optional dependencies "
             "(`pip install -e '.[hf]'`). Checking and planning never need them.",
             'model "path/to/hf-folder"  backend torch   # without transformers installed'),
    CodeInfo("Q404", "model checkpoint cannot be read",
             "The torch backend reads weights from the folder's safetensors files, one block at a time. A file "
             "with a broken header, a truncated tensor, a parameter of the architecture that no file holds, or "
             "blocks that are not one ModuleList stop the compile before any weight is quantized.",
             "model.safetensors cut short by an interrupted download"),
    CodeInfo("Q401", "calibration data cannot be read",
             "The file named in `data npz`, `data text` or `data dataset` is missing or unreadable (not a numpy "
             "archive, not UTF-8 text, not a dataset format qrc reads). qrc reads no network: a Hub dataset name "
             "works only when the Hugging Face cache already holds it.",
             'data npz "calib.npz"   # no such file'),
    CodeInfo("Q402", "calibration data lacks a model input",
             "An npz file needs one array per model input, named like the input, samples on axis 0.",
             "numpy.savez('calib.npz', input_ids=ids)   # the model also takes attention_mask"),
    CodeInfo("Q403", "calibration data has the wrong dtype or shape",
             "Each array must have the input's dtype and, after the samples axis, the input's fixed dimensions.",
             "input_ids saved as float32 for an int64 input"),
    CodeInfo("Q434", "dataset column missing or of the wrong kind",
             "`data dataset` reads one column of each row: `text` (strings) or `messages` (a list of {role, content} "
             "turns). A column the rows lack, or one holding something else, would calibrate on nothing; `qrc check` "
             "reads the column names from the file's schema or first row.",
             'data dataset "chat.jsonl" { messages "conversation" }   # the rows have `messages`'),
    CodeInfo("Q435", "dataset split missing or empty",
             "The split named by `split` (default `train`) must exist and have rows: Parquet metadata, a CSV or JSONL "
             "file's first row and a save_to_disk folder's split list tell at check time.",
             'data dataset "saved/" { split "validation" }   # saved with train and test only'),
    CodeInfo("Q436", "tokenizer has no chat template",
             "Chat rows (`messages`) are rendered through the tokenizer's own chat template, as the model was trained "
             "on them; a tokenizer without one (or a lone tokenizer.json) cannot render them.",
             'data dataset "chat.jsonl" { messages "messages"  tokenizer "tokenizer.json" }'),
    CodeInfo("Q437", "int8 activations on the ONNX backend: slower than float on x86 CPUs (warning)",
             "onnxruntime's x86 CPU integer kernels multiply uint8 activations by int8 weights. It rewrites an int8 "
             "activation to uint8 only where a single MatMul reads it; q/k/v and gate/up share their input, so those "
             "MatMuls dequantize their weights and run in float on every forward (a 55M decoder: 97 ms against 25.6 "
             "ms float and 16.8 ms with uint8). On ONNX the presets and a bare `activations …` write uint8, whose "
             "asymmetric grid is int8's shifted by 128; `qrc plan` lists the kernels each layer gets.",
             "scheme s = W8A8 { activations int8 }   # on an .onnx model"),
    CodeInfo("Q438", "a scheme that is no GGUF type",
             "A GGUF file stores each weight in one of llama.cpp's types, and its kernels read only those blocks: "
             "Q8_0 is int8 in groups of 32 with one float16 scale each (symmetric), Q4_0 the same in int4; the K-quants, "
             "MXFP4 and NVFP4 (the `MXFP4A16`/`NVFP4A16` presets; NVFP4 rows in whole super-blocks of 64). A group size, "
             "an asymmetric grid, quantized inputs or a KV cache setting have no place in the file; llama.cpp quantizes "
             "its inputs itself and sets its cache's type at run time. An MoE block's experts of one projection are "
             "one merged tensor there (`ffn_gate_exps`), so they take one type, and its router stays float "
             "(`ffn_gate_inp`, which llama-quantize never rounds).",
             "scheme w4 { weights int4 group 128 symmetric }   # with emit … { format gguf }"),
    CodeInfo("Q439", "a model the GGUF writer cannot hold",
             "qrc writes GGUF for the decoders whose llama.cpp graph it knows (Llama, Mistral, Qwen2, Qwen3, Mixtral, "
             "Qwen3-MoE with its chosen experts' weights renormalised and no dense blocks, gpt-oss) from a "
             "transformers folder, and puts the folder's tokenizer in the file so that llama.cpp needs nothing else: a "
             "byte-level BPE tokenizer.json whose pre-tokenizer llama.cpp knows by name (GPT-2's, Llama 3's, Qwen2's, GPT-4o's). "
             "Other families, built-in models, RoPE scaling (but gpt-oss's YaRN), SentencePiece tokenizers and a "
             "tokenizer with ids past the embedding's rows (llama.cpp's token table is those rows) are refused "
             "before any work.",
             'model "builtin:tiny-llama"   # with emit "out.gguf" { format gguf }'),
    CodeInfo("Q269", "a calibration method NVFP4 inputs cannot use",
             "NVFP4 rounds each block of 16 inputs at run time under one global scale per layer, set from the inputs' "
             "calibrated range (448·6 / its absolute maximum). `mse` and `layerwise_percentile` choose a clipping range "
             "by the error on an integer grid, which these inputs do not have; a range from minmax, a percentile or "
             "entropy is what the global scale takes.",
             "quantize { type Linear -> NVFP4 }\ncalibrate { method mse }"),
    CodeInfo("Q270", "an attention kernel for a model without one to choose",
             "`calibrate { attention eager|sdpa }` sets the attention implementation a transformers model runs "
             "calibration and verification with (llm-compressor calibrates under eager attention; transformers' default "
             "is SDPA, whose float rounding differs in the last bits, enough to change a calibrated scale's last bit). "
             "An exported ONNX graph and qrc's built-in models compute attention one way only.",
             'model "builtin:tiny-llama"\ncalibrate { attention eager }'),
    CodeInfo("Q405", "tensor never finite: left unquantized (warning)",
             "A tensor whose values were all -inf, inf or NaN during calibration has no range; it stays in float "
             "instead of getting a NaN scale.",
             "a layer whose input is an attention mask made of -inf"),
    CodeInfo("Q406", "calibration took fewer samples to hold out verification's (warning)",
             "Verification never measures on samples the model was calibrated on (its figures would be optimistic). "
             "When the data file is too short for the recipe's `samples` and the verification samples both, its "
             "last samples are held out for verification and calibration takes the ones before: the warning says "
             "how many of each.",
             'data npz "calib.npz" { samples 128 }   # the file has exactly 128; verify { samples 8 } takes 8 of them'),
    CodeInfo("Q407", "multi_gpu fell back to low_memory (warning)",
             "multi_gpu places every block whole on one GPU. When no GPU is visible, or the recipe's `vram` "
             "cannot hold the blocks without splitting one, the compile runs block by block on the CPU "
             "(low_memory) instead, and says why.",
             "memory { mode multi_gpu  vram [80 GiB, 80 GiB] }   # on a machine without GPUs"),
    CodeInfo("Q408", "resume state ignored (warning)",
             "With `disk`, calibration saves its observers after each segment (ONNX), or each finished block with the "
             "hidden states entering the next (torch, `offload`), so a killed compile resumes. The state is data only "
             "(integer histograms, safetensors and JSON, format-versioned) and validated when read; a file that is not "
             "such a state, damaged, from another version, one whose hidden states or staged output are gone, or "
             "torchrun's ranks that stopped after different blocks: it is ignored and replaced, and the run starts "
             "over. Nothing from the cache folder is ever executed.",
             'memory { disk "cache" }   # with a foreign file at cache/checkpoints/calibration-….npz'),
    CodeInfo("Q409", "non-finite weights",
             "A weight with NaN or infinite values has no finite range: its scale would be NaN or infinite and the "
             "emitted model would compute garbage. The compile stops before anything is written; give the layer "
             "`-> none` to keep it as it is, or repair the checkpoint.",
             'quantize { type Linear -> W8A8 }   # a checkpoint where fc1.weight holds a NaN'),
    CodeInfo("Q410", "dynamic or per-token activations on the ONNX backend",
             "The ONNX backend emits static per-tensor QuantizeLinear/DequantizeLinear pairs.",
             "scheme s { weights int8  activations int8 dynamic }"),
    CodeInfo("Q411", "scheme or format the torch backend cannot emit",
             "The torch backend writes compressed-tensors safetensors: Linear layers only, signed integer "
             "types (asymmetric instead of unsigned), groups that divide the input features, dynamic "
             "activations symmetric, per-token activations dynamic.",
             "backend torch  …  \"model.embed_tokens\" -> W8A16   # an Embedding"),
    CodeInfo("Q415", "model folder the ONNX backend cannot export",
             "An HF-style folder compiled with `backend onnx` is first exported to ONNX; the exporter knows BERT-family "
             "folders only so far. `qrc check` refuses other families before any work.",
             'model "path/to/llama-folder"  backend onnx'),
    CodeInfo("Q416", "output path would replace an input",
             "The output path is the model file, lies inside the model's folder, contains the model, or is a symbolic "
             "link. Writing there could destroy the float model (or what the link points to), so qrc refuses before "
             "any work, for the recipe's `emit` path at `qrc check` and for `-o` at `qrc compile`.",
             'model "m.onnx"   emit "m.onnx"'),
    CodeInfo("Q417", "the output cannot be written",
             "The destination's folder is read-only, is not a folder, or has less free space than the plan says the "
             "output takes; or writing failed while the compile ran (disk full). A rotation or smoothing on the ONNX "
             "backend also writes a copy of the model first, to `memory { disk }` where the recipe gives one, else to "
             "the temporary folder (TMPDIR). qrc checks before any work, and a failed write leaves nothing at the "
             "destination.",
             'qrc compile r.recipe -o /read-only/out.onnx'),
    CodeInfo("Q440", "the output path holds files qrc did not write",
             "A compile replaces its destination whole, so it replaces only what an earlier qrc compile wrote: a "
             "folder with qrc's `qrc.recipe` at its top, or a model file carrying qrc's provenance key. A folder of "
             "other files, or another program's file, is refused before any work; `qrc compile --overwrite` "
             "replaces it on purpose.",
             "qrc compile r.recipe -o ~/thesis   # a folder of your own files"),
    CodeInfo("Q441", "a file qrc writes is a link, a FIFO or a device",
             "Every file qrc creates or rewrites (the output, its staging, the destination lock, resume states and "
             "their owner records, reports, `.verify.json`, caches) is opened without following a link and must be "
             "a regular file: a symbolic link planted at one of those names (in a shared scratch folder, say) would "
             "otherwise make the compile write what it points to. The compile stops and the link's target is left "
             "as it was.",
             "ln -s ~/.bashrc out/.model.qrc-lock; qrc compile r.recipe -o out/model"),
    CodeInfo("Q442", "a chat template failed",
             "Chat rows (`messages`) are rendered through the tokenizer's own chat template, which is code from a "
             "download. qrc renders it in Jinja's sandbox in a child process with a deadline per row "
             "(QRC_TEMPLATE_SECONDS, default 10 s), a cap on the rendered text (QRC_TEMPLATE_CHARS, default 4,000,000 "
             "characters) and on the child's memory (QRC_TEMPLATE_MEMORY, default 1 GiB). A syntax error, "
             "`raise_exception(...)`, an undefined name, an include, a sandbox escape refused, a loop past the "
             "deadline or an output past a cap stops the compile with the template file, its line where Jinja "
             "gives one, and the dataset row; nothing is written.",
             "{% for i in range(100000) %}{% for j in range(100000) %}…   # in chat_template.jinja"),
    CodeInfo("Q443", "an environment variable qrc reads is not a number in range",
             "qrc reads a few numbers from the environment: torchrun's RANK, WORLD_SIZE, LOCAL_RANK and "
             "LOCAL_WORLD_SIZE, QRC_RANK_TIMEOUT, and the chat template limits QRC_TEMPLATE_SECONDS, "
             "QRC_TEMPLATE_CHARS and QRC_TEMPLATE_MEMORY. Junk, NaN, infinity or a value out of range is refused "
             "with the variable's name and range instead of a silent default or a traceback.",
             "QRC_RANK_TIMEOUT=nan qrc compile r.recipe"),
    CodeInfo("Q444", "the ranks could not form their process group",
             "Under torchrun every rank joins one process group before any work. A peer that never started, no "
             "MASTER_ADDR, or a port that cannot be reached stops this rank with what torch reported; nothing is "
             "written.",
             "RANK=0 WORLD_SIZE=2 qrc compile r.recipe   # without torchrun"),
    CodeInfo("Q445", "the system refused to start a thread",
             "qrc samples its memory, checks the output and reads ahead on threads of its own. Where the system "
             "refuses one (a process limit, or `ulimit -v` too low for a thread's stack), the rounding falls back "
             "to the calling thread; any other refusal stops the compile with this code and nothing written.",
             "ulimit -u 1; qrc compile r.recipe"),
    CodeInfo("Q446", "torchrun's ranks were given different runs",
             "Every rank of a torchrun compile must run the same recipe, settings and output: each plans its share "
             "of one run, and the first rank writes what all of them rounded. Ranks started with different ones "
             "(a wrapper that picks a recipe by RANK) stop together before any work.",
             "RANK=0 → a.recipe, RANK=1 → b.recipe under one torchrun"),
    CodeInfo("Q447", "the run went past its memory plan (warning)",
             "qrc measures the compile's resident memory (sampled every 20 ms, and the kernel's high-water mark) "
             "against the plan. A peak more than 10% above the plan is said in the summary and at the top of the "
             "report, with the op that was running at the highest sample: the plan is a promise, and a run that "
             "breaks it must say so rather than only show it in a chart.",
             "a compile whose plan says 226 MiB and whose peak measures 330 MiB"),
    CodeInfo("Q448", "the data is too short to hold out verification samples",
             "Verification measures on samples calibration never saw. A data file that cannot give at least one "
             "calibration sample and the verification samples besides is refused before any work is measured on "
             "it.",
             'data text "one-line.txt" { samples 64 }   # one sample, and verify { samples 4 }'),
    CodeInfo("Q449", "onnxruntime-genai's files beside the output belong to another model (warning)",
             "An exported decoder is written with the files onnxruntime-genai reads beside it (`genai_config.json`, "
             "the tokenizer), and genai loads one decoder a folder. Where the output's folder already holds such "
             "files for another model (a second decoder emitted into `out/`, or a genai builder's folder), they "
             "are kept as they were and this output is written without them: it runs in onnxruntime, and in "
             "genai once it has a folder of its own.",
             "qrc compile a.recipe -o out/a.onnx; qrc compile b.recipe -o out/b.onnx"),
    CodeInfo("Q412", "no output path",
             "A compile writes a model: the recipe needs `emit \"PATH\"` or the command line `-o PATH`.",
             "qrc compile r.recipe   # and no emit in r.recipe"),
    CodeInfo("Q413", "output path of the wrong kind",
             "The ONNX backend writes one .onnx file (plus .onnx.data for large models); the torch backend "
             "writes a folder. An existing path of the other kind is not overwritten.",
             "qrc compile r.recipe -o out/"),
    CodeInfo("Q419", "onnxruntime cannot run the model on this data",
             "Calibration and verification run the model in onnxruntime on the recipe's samples. Some graphs accept "
             "only some shapes: onnxruntime-genai's builder writes GroupQueryAttention, which takes a filled cache "
             "(past > 0) with several new tokens only one sample at a time. Such a combination is refused at "
             "`check`; any other error onnxruntime raises on the data ends the compile with its message, and "
             "nothing is written.",
             'calibrate { data npz "cache.npz"  chunk 8 }   # past 96, 4 new tokens, a builder decoder'),
    CodeInfo("Q450", "an installed qrc plug-in could not be loaded (warning)",
             "Packages add calibration methods, rounding methods, transforms, types and output formats by declaring "
             "an entry point in the group `qrc.plugins`; qrc imports each when it starts. One whose import fails is "
             "reported and left out, and a recipe that names what it would have registered gets Q107.",
             "pip install my-qrc-methods   # whose entry point names a module that no longer exists"),
    CodeInfo("Q451", "learned rounding's steps ran uncompiled (warning)",
             "Where a run's learned rounding (`rounding autoround`) is long enough to pay for it and a C++ compiler "
             "is found, its steps run through torch.compile, and the plan's time counts them so. Where the "
             "compiler then fails, the steps run uncompiled: the same rounding, in about twice the planned time. "
             "The warning names the failure; `TORCHDYNAMO_DISABLE=1` makes the plan count uncompiled steps "
             "from the start.",
             "CXX=/broken/g++ qrc compile recipes/smollm2-autoround-w4a16.recipe"),
    CodeInfo("Q453", "a folder the plan counts as disk is held in memory (warning)",
             "The plan counts what a run writes to `memory { disk }` (block caches, resume states, the ONNX "
             "backend's copies of the model) and to the temporary folder (TMPDIR: those copies without `disk`) as "
             "disk. Where that folder lies on a tmpfs or ramfs (a `/tmp` that is one, `/dev/shm`), its files are "
             "pages of RAM beside the planned peak, and an `offload` that writes there saves no memory. `qrc "
             "check` says so, with the bytes it knows of; the plan's figures stay those of a disk.",
             'memory { mode offload  disk "/dev/shm/qrc" }'),
    CodeInfo("Q452", "transformers cannot run the model",
             "Calibration, statistics and verification run the model as transformers builds it from config.json. "
             "Where the model class itself fails on the data (transformers 5.24's Llama4ForConditionalGeneration "
             "reads `image_outputs` from its language model's output, which has none), the compile stops with the "
             "class and its error, and nothing is written. Rounding that needs no model run (data-free, without "
             "`verify`) reads the files alone and still compiles.",
             "model \"llama4-vlm/\"   # Llama4ForConditionalGeneration, text-only samples"),
)
