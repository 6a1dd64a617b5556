"""Every diagnostic code qrc emits: what it means, why it matters, an example. Used by `qrc explain`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CodeInfo:
    """A diagnostic code's meaning, why it matters, and an example (`qrc explain CODE`)."""
    code: str
    title: str
    why: str
    example: str


def _c(code: str, title: str, why: str, example: str) -> CodeInfo:
    return CodeInfo(code, title, why, example)


CODES: tuple[CodeInfo, ...] = (
    # ---- Q1xx: syntax -----------------------------------------------------------------------------
    _c("Q100", "the recipe file cannot be read",
       "qrc needs the recipe text before anything else; the path is missing, a folder, or not readable.",
       "qrc check recipes/does-not-exist.recipe"),
    _c("Q101", "the recipe is not UTF-8 text",
       "Recipes are UTF-8. A byte that is not UTF-8 usually means the path points at a binary file "
       "(a model, an archive) instead of a recipe.",
       "qrc check model.onnx"),
    _c("Q102", "the recipe is empty",
       "A file with only whitespace or comments describes nothing to compile.",
       "# just a comment"),
    _c("Q103", "unexpected character",
       "A character that no part of the language uses (a control character, `@`, `;`, a smart quote).",
       'recipe r { model "builtin:tiny-llama"; }'),
    _c("Q104", "unexpected token",
       "The parser found a word, number or symbol where something else was expected; the message lists "
       "what would have been valid there.",
       "calibrate { chunk }"),
    _c("Q105", "unclosed `{` or `[`",
       "The file ends while a block or list is still open. The diagnostic points at the bracket that was "
       "never closed, which is usually far from where the file ends.",
       "scheme w4 { weights int4 group 128"),
    _c("Q106", "missing `->` in a quantize rule",
       "A quantize rule maps selectors to a scheme with `->`; without it qrc cannot tell where the "
       "selectors end.",
       'quantize { "*" w4 }   # write: "*" -> w4'),
    _c("Q107", "unknown or misplaced keyword",
       "A word that is not a keyword of the language, or a keyword used in a block where it does not "
       "belong (`chunk` outside `calibrate`). The help suggests the closest keyword or the right block.",
       "calibrte { chunk 8 }"),
    _c("Q108", "size without a valid unit",
       "Memory budgets are sizes with a unit; a bare number is ambiguous (bytes? GiB?). Binary units "
       "(KiB MiB GiB TiB) are powers of 1024, decimal ones (KB MB GB TB) powers of 1000.",
       "memory { ram 4 }   # write: ram 4 GiB"),
    _c("Q109", "unterminated string",
       "A string must close with `\"` on the same line; otherwise everything after it would be swallowed.",
       'model "builtin:tiny-llama'),
    _c("Q110", "unmatched `}`",
       "A closing brace with no block open: often a leftover from an edit, or the `{` it should match is "
       "missing.",
       "recipe r { } }"),
    _c("Q111", "text after the end of the recipe",
       "A recipe file holds exactly one `recipe NAME { … }`; text after its closing brace is not part of it.",
       "recipe r { }\nquantize { }"),
    _c("Q112", "the recipe file is too large",
       "Recipes are small text files; a file of megabytes is almost certainly the wrong path.",
       "qrc check weights.bin"),
    # ---- Q2xx: meaning ----------------------------------------------------------------------------
    _c("Q201", "pattern matches no layer",
       "A selector (or a group pattern) that matches nothing would silently leave the layers you meant "
       "unquantized. The help lists the model's closest layer names; `qrc inspect MODEL` lists them all.",
       'quantize { "*.mlp.gate" -> w4 }   # the layers are named *.mlp.gate_proj'),
    _c("Q202", "rule never wins (warning)",
       "Rules apply in order and the last match wins; a rule whose every layer is taken by later rules has "
       "no effect, which usually means the rules are in the wrong order.",
       'quantize { "*.self_attn.*" -> w8  "*" -> w4 }   # "*" comes last and takes everything'),
    _c("Q203", "undefined scheme",
       "A rule or a mixed-precision choice names a scheme that is neither defined in the recipe, a preset "
       "(W4A16, W8A16, W8A8) nor `none`. Without this check the layers would silently stay in float.",
       'quantize { "*" -> w4 }   # no `scheme w4 { … }`'),
    _c("Q204", "duplicate scheme name",
       "Two schemes with one name (or a scheme named like a preset or `none`) make every rule that uses "
       "the name ambiguous.",
       "scheme w4 { weights int4 group 128 }\nscheme w4 { weights int4 group 64 }"),
    _c("Q205", "unknown preset or base scheme",
       "`scheme NAME = BASE { … }` refines BASE, which must be a preset (W4A16, W8A16, W8A8) or a scheme "
       "defined earlier in the file.",
       "scheme w4 = W4A8 { group 64 }"),
    _c("Q206", "scheme quantizes no weights",
       "Every scheme quantizes weights (activation-only quantization has no runtime kernels). Add a "
       "`weights` line or refine a preset.",
       "scheme a8 { activations int8 }"),
    _c("Q207", "option does not apply to weights or activations",
       "Weights take per_tensor, per_channel or group N; activations take per_tensor or per_token and "
       "static/dynamic. A misplaced option would otherwise be ignored.",
       "scheme s { weights int8 per_token }"),
    _c("Q208", "block size MatMulNBits cannot take",
       "onnxruntime's MatMulNBits kernel needs weight-only schemes with `group N`, N a power of two ≥ 16. "
       "Other sizes fail when the emitted model is loaded, after the whole compile.",
       'scheme w4 { weights int4 group 100 }\nemit "m.onnx" { format matmul_nbits }'),
    _c("Q209", "percentile outside (0, 100]",
       "Percentile calibration clips activations at the given percentile of |x|; values outside (0, 100] "
       "have no meaning.",
       "method percentile 999"),
    _c("Q210", "group instance would end with mixed schemes (policy error)",
       "Fused attention kernels and exporters need Q, K and V of one block at one precision. With "
       "`policy error` a mixed instance is an error instead of being promoted.",
       'quantize { "*" -> w4  "*.v_proj" -> w8 }\ngroup "*.self_attn.{q,k,v}_proj" policy error'),
    _c("Q211", "group members promoted to one scheme (warning)",
       "With `policy promote` (the default) every member of a mixed instance takes the widest member's "
       "scheme (more bits, then weight-only, then finer granularity); the warning lists what moved.",
       'quantize { "*" -> w4  "*.v_proj" -> w8 }\ngroup "*.self_attn.{q,k,v}_proj"'),
    _c("Q212", "group pattern without exactly one `{…}`",
       "A group is written as one glob whose members differ only inside a single `{a,b,…}` alternation; "
       "that is how qrc forms one group instance per block.",
       'group "*.self_attn.q_proj"   # write: "*.self_attn.{q,k,v}_proj"'),
    _c("Q213", "invalid regular expression",
       "`re\"…\"` selectors use Python regex syntax and must fully match a layer name.",
       'quantize { re"layers.(0|1" -> w4 }'),
    _c("Q214", "invalid glob pattern",
       "Globs know `*`, `?` and one level of `{a,b}`; an unbalanced or nested brace cannot match as meant.",
       'quantize { "*.{q,k" -> w4 }'),
    _c("Q215", "setting given twice",
       "A setting, block or spec item given twice would make one of them silently win; qrc asks you to "
       "keep one.",
       "calibrate { chunk 8  chunk 16 }"),
    _c("Q216", "required setting missing",
       "Some settings have no sensible default: the model, a mixed-precision budget and choices, the "
       "tokenizer of text data, a path.",
       "recipe r { quantize { \"*\" -> W8A16 } }   # no model"),
    _c("Q217", "count is not a positive whole number",
       "Counts (chunk, samples, seqlen, workers, bins, group sizes) are whole numbers; fractions or zero "
       "cannot be executed.",
       "calibrate { chunk 0 }"),
    _c("Q218", "verify bound outside the metric's range",
       "cosine lies in [-1, 1], top1 in [0, 1], kld ≥ 0; an unreachable bound would fail (or pass) every "
       "compile.",
       "verify { metric cosine at_least 1.5 }"),
    _c("Q219", "verify bound in the wrong direction",
       "For cosine, sqnr and top1 higher is better (`at_least`); for kld lower is better (`at_most`).",
       "verify { metric kld at_least 0.1 }"),
    _c("Q220", "emit format not available on the backend",
       "The ONNX backend emits `qdq` or `matmul_nbits`; the torch backend emits `safetensors`.",
       'backend torch\nemit "m.onnx" { format qdq }'),
    _c("Q221", "`mode multi_gpu` without `vram`",
       "Placing layers on several GPUs needs the memory each device may use.",
       "memory { mode multi_gpu }   # add: vram 2 x 80 GiB"),
    _c("Q222", "option does not apply to this data source",
       "synthetic data takes samples/seqlen/seed, npz takes samples (shapes come from the file), text "
       "takes samples/seqlen/tokenizer.",
       'data npz "calib.npz" { seqlen 128 }'),
    _c("Q223", "mixed-precision choices unusable",
       "The search needs at least two different quantized schemes to choose between; `none` is not a "
       "choice (keep layers float with a `-> none` rule).",
       "mixed_precision { choices [w4] budget 4 bits }"),
    _c("Q224", "bit budget below the narrowest choice",
       "The average weight bits cannot go below the narrowest scheme in `choices`, so no assignment can "
       "meet the budget.",
       "mixed_precision { choices [w4, w8] budget 3 bits }"),
    _c("Q225", "4-bit integer activations",
       "No runtime has kernels for 4-bit integer activations; activations are int8, uint8 or fp8, or the 4-bit "
       "floating formats with their own block scales (`nvfp4`, `mxfp4`: the NVFP4 and MXFP4 presets).",
       "scheme s { weights int4 group 128  activations int4 }"),
    _c("Q226", "gptq rounding on a layer that is not a MatMul or Gemm",
       "GPTQ rounds a weight against the Hessian of the activations it multiplies; an embedding (Gather) "
       "multiplies nothing and a Conv's input is not a row of features, so on the ONNX backend GPTQ takes "
       "MatMul and Gemm weights only.",
       'quantize { "*" -> w4gptq }   # with backend onnx: the embedding (Gather) is matched too'),
    _c("Q227", "op cannot pass calibration ranges through",
       "`passthrough` lists distribution-preserving ops whose outputs inherit their input's range; other "
       "ops change the distribution and must be observed.",
       "passthrough [Softmax]"),
    _c("Q228", "unknown layer type",
       "`type X` selects layers by kind: Linear, MatMul, Gemm, Conv or Embedding.",
       "quantize { type Dense -> w8 }"),
    _c("Q229", "bit budget below the cheapest assignment",
       "The budget counts storage bits per weight over the searched layers, scales and zero points "
       "included (int4 in groups of 128 with float32 scales is 4.25 bits). A budget below every searched "
       "layer at its cheapest choice cannot be met.",
       "mixed_precision { choices [w4, w8] budget 4.1 bits }   # w4 = W4A16, group 128"),
    _c("Q230", "unknown `--set` key",
       "`--set` replaces one setting of the recipe; the key names the block and the setting.",
       "qrc check r.recipe --set memory.rma=2GiB"),
    _c("Q231", "`--set` without `key=value`",
       "Each `--set` takes one `key=value` pair.",
       "qrc check r.recipe --set memory.ram"),
    _c("Q232", "zero or negative memory budget",
       "A budget of zero cannot fit anything; leave the setting out to have qrc detect free memory.",
       "memory { ram 0 GiB }"),
    _c("Q234", "`mode multi_gpu` on the ONNX backend",
       "Multi-GPU placement is done by the torch backend; ONNX runs on one device.",
       "backend onnx\nmemory { mode multi_gpu vram 2 x 80 GiB }"),
    # ---- Q3xx: plan and memory ------------------------------------------------------------------
    _c("Q301", "the plan does not fit the memory budget",
       "qrc estimates the peak memory of every mode before any work starts. An explicit mode, or every "
       "mode under `auto`, that exceeds the budget (`ram`, or 85% of free memory) is refused instead of "
       "running out of memory an hour into calibration. The help names a way out that does fit: a "
       "smaller `chunk`, `mode offload`, or a `disk` cache; or, when even one sample cannot fit, the "
       "tensor that is too large.",
       "memory { mode full  ram 1 GiB }   # on a model whose weights alone exceed 1 GiB"),
    # ---- Q4xx: backend and execution ---------------------------------------------------------------
    _c("Q302", "the run went above its ram budget",
       "With `ram` in the recipe, qrc samples its own resident memory while it compiles and stops (writing "
       "nothing) the moment it is above the budget, instead of overrunning it. The plan's estimate is within "
       "±25% of what runs; a model that measures above it needs more `ram`, a smaller `chunk`, or offload.",
       'memory { ram 600 MiB }   # a compile whose real peak is 700 MiB'),
    _c("Q400", "backend dependency not installed",
       "The torch backend opens HF-style folders with transformers, and the ONNX backend exports them with "
       "torch.onnx (decoders through its dynamo exporter, which needs onnxscript): optional dependencies "
       "(`pip install -e '.[hf]'`). Checking and planning never need them.",
       'model "path/to/hf-folder"  backend torch   # without transformers installed'),
    _c("Q404", "model checkpoint cannot be read",
       "The torch backend reads weights from the folder's safetensors files, one block at a time. A file "
       "with a broken header, a truncated tensor, a parameter of the architecture that no file holds, or "
       "blocks that are not one ModuleList stop the compile before any weight is quantized.",
       "model.safetensors cut short by an interrupted download"),
    _c("Q401", "calibration data cannot be read",
       "The file named in `data npz`, `data text` or `data dataset` is missing or unreadable (not a numpy "
       "archive, not UTF-8 text, not a dataset format qrc reads). qrc reads no network: a Hub dataset name "
       "works only when the Hugging Face cache already holds it.",
       'data npz "calib.npz"   # no such file'),
    _c("Q402", "calibration data lacks a model input",
       "An npz file needs one array per model input, named like the input, samples on axis 0.",
       "numpy.savez('calib.npz', input_ids=ids)   # the model also takes attention_mask"),
    _c("Q403", "calibration data has the wrong dtype or shape",
       "Each array must have the input's dtype and, after the samples axis, the input's fixed dimensions.",
       "input_ids saved as float32 for an int64 input"),
    _c("Q434", "dataset column missing or of the wrong kind",
       "`data dataset` reads one column of each row: `text` (strings) or `messages` (a list of {role, content} "
       "turns). A column the rows lack, or one holding something else, would calibrate on nothing; `qrc check` "
       "reads the column names from the file's schema or first row.",
       'data dataset "chat.jsonl" { messages "conversation" }   # the rows have `messages`'),
    _c("Q435", "dataset split missing or empty",
       "The split named by `split` (default `train`) must exist and have rows: Parquet metadata, a CSV or JSONL "
       "file's first row and a save_to_disk folder's split list tell at check time.",
       'data dataset "saved/" { split "validation" }   # saved with train and test only'),
    _c("Q436", "tokenizer has no chat template",
       "Chat rows (`messages`) are rendered through the tokenizer's own chat template, as the model was trained "
       "on them; a tokenizer without one (or a lone tokenizer.json) cannot render them.",
       'data dataset "chat.jsonl" { messages "messages"  tokenizer "tokenizer.json" }'),
    _c("Q437", "int8 activations on the ONNX backend: slower than float on x86 CPUs (warning)",
       "onnxruntime's x86 CPU integer kernels multiply uint8 activations by int8 weights. It rewrites an int8 "
       "activation to uint8 only where a single MatMul reads it; q/k/v and gate/up share their input, so those "
       "MatMuls dequantize their weights and run in float on every forward (a 55M decoder: 97 ms against 25.6 "
       "ms float and 16.8 ms with uint8). On ONNX the presets and a bare `activations …` write uint8, whose "
       "asymmetric grid is int8's shifted by 128; `qrc plan` lists the kernels each layer gets.",
       "scheme s = W8A8 { activations int8 }   # on an .onnx model"),
    _c("Q438", "a scheme that is no GGUF type",
       "A GGUF file stores each weight in one of llama.cpp's types, and its kernels read only those blocks: "
       "Q8_0 is int8 in groups of 32 with one float16 scale each (symmetric), Q4_0 the same in int4. A group size, "
       "an asymmetric grid, quantized inputs or a KV cache setting have no place in the file; llama.cpp quantizes "
       "its inputs itself and sets its cache's type at run time.",
       "scheme w4 { weights int4 group 128 symmetric }   # with emit … { format gguf }"),
    _c("Q439", "a model the GGUF writer cannot hold",
       "qrc writes GGUF for the decoders whose llama.cpp graph it knows (Llama, Mistral, Qwen2, Qwen3) from a "
       "transformers folder, and puts the folder's tokenizer in the file so that llama.cpp needs nothing else: a "
       "byte-level BPE tokenizer.json whose pre-tokenizer llama.cpp knows by name (GPT-2's, Llama 3's, Qwen2's). "
       "Other families, built-in models, RoPE scaling and SentencePiece tokenizers are refused before any work.",
       'model "builtin:tiny-llama"   # with emit "out.gguf" { format gguf }'),
    _c("Q269", "a calibration method NVFP4 inputs cannot use",
       "NVFP4 rounds each block of 16 inputs at run time under one global scale per layer, set from the inputs' "
       "calibrated range (448·6 / its absolute maximum). `mse` and `layerwise_percentile` choose a clipping range "
       "by the error on an integer grid, which these inputs do not have; a range from minmax, a percentile or "
       "entropy is what the global scale takes.",
       "quantize { type Linear -> NVFP4 }\ncalibrate { method mse }"),
    _c("Q270", "an attention kernel for a model without one to choose",
       "`calibrate { attention eager|sdpa }` sets the attention implementation a transformers model runs "
       "calibration and verification with (llm-compressor calibrates under eager attention; transformers' default "
       "is SDPA, whose float rounding differs in the last bits, enough to change a calibrated scale's last bit). "
       "An exported ONNX graph and qrc's built-in models compute attention one way only.",
       'model "builtin:tiny-llama"\ncalibrate { attention eager }'),
    _c("Q405", "tensor never finite: left unquantized (warning)",
       "A tensor whose values were all -inf, inf or NaN during calibration has no range; it stays in float "
       "instead of getting a NaN scale.",
       "a layer whose input is an attention mask made of -inf"),
    _c("Q406", "verification reuses calibration samples (warning)",
       "An npz file with too few samples cannot hold out separate verification samples; the figures are "
       "then optimistic.",
       'data npz "calib.npz" { samples 128 }   # the file has exactly 128'),
    _c("Q407", "multi_gpu fell back to low_memory (warning)",
       "multi_gpu places every block whole on one GPU. When no GPU is visible, or the recipe's `vram` "
       "cannot hold the blocks without splitting one, the compile runs block by block on the CPU "
       "(low_memory) instead, and says why.",
       "memory { mode multi_gpu  vram [80 GiB, 80 GiB] }   # on a machine without GPUs"),
    _c("Q408", "resume state ignored (warning)",
       "With `disk`, calibration saves its observers after each segment (ONNX), or each finished block with the "
       "hidden states entering the next (torch, `offload`), so a killed compile resumes. The state is data only "
       "(integer histograms, safetensors and JSON, format-versioned) and validated when read; a file that is not "
       "such a state, damaged, from another version, one whose hidden states or staged output are gone, or "
       "torchrun's ranks that stopped after different blocks: it is ignored and replaced, and the run starts "
       "over. Nothing from the cache folder is ever executed.",
       'memory { disk "cache" }   # with a foreign file at cache/checkpoints/calibration-….npz'),
    _c("Q409", "non-finite weights",
       "A weight with NaN or infinite values has no finite range: its scale would be NaN or infinite and the "
       "emitted model would compute garbage. The compile stops before anything is written; give the layer "
       "`-> none` to keep it as it is, or repair the checkpoint.",
       'quantize { type Linear -> W8A8 }   # a checkpoint where fc1.weight holds a NaN'),
    _c("Q410", "dynamic or per-token activations on the ONNX backend",
       "The ONNX backend emits static per-tensor QuantizeLinear/DequantizeLinear pairs.",
       "scheme s { weights int8  activations int8 dynamic }"),
    _c("Q411", "scheme or format the torch backend cannot emit",
       "The torch backend writes compressed-tensors safetensors: Linear layers only, signed integer "
       "types (asymmetric instead of unsigned), groups that divide the input features, dynamic "
       "activations symmetric, per-token activations dynamic.",
       "backend torch  …  \"model.embed_tokens\" -> W8A16   # an Embedding"),
    _c("Q415", "model folder the ONNX backend cannot export",
       "An HF-style folder compiled with `backend onnx` is first exported to ONNX; the exporter knows BERT-family "
       "folders only so far. `qrc check` refuses other families before any work.",
       'model "path/to/llama-folder"  backend onnx'),
    _c("Q416", "output path would replace an input",
       "The output path is the model file, lies inside the model's folder, contains the model, or is a symbolic "
       "link. Writing there could destroy the float model (or what the link points to), so qrc refuses before "
       "any work, for the recipe's `emit` path at `qrc check` and for `-o` at `qrc compile`.",
       'model "m.onnx"   emit "m.onnx"'),
    _c("Q417", "the output cannot be written",
       "The destination's folder is read-only, is not a folder, or has less free space than the plan says the "
       "output takes; or writing failed while the compile ran (disk full). qrc checks before any work, and a "
       "failed write leaves nothing at the destination.",
       'qrc compile r.recipe -o /read-only/out.onnx'),
    _c("Q412", "no output path",
       "A compile writes a model: the recipe needs `emit \"PATH\"` or the command line `-o PATH`.",
       "qrc compile r.recipe   # and no emit in r.recipe"),
    _c("Q413", "output path of the wrong kind",
       "The ONNX backend writes one .onnx file (plus .onnx.data for large models); the torch backend "
       "writes a folder. An existing path of the other kind is not overwritten.",
       "qrc compile r.recipe -o out/"),
    _c("Q419", "onnxruntime cannot run the model on this data",
       "Calibration and verification run the model in onnxruntime on the recipe's samples. Some graphs accept "
       "only some shapes: onnxruntime-genai's builder writes GroupQueryAttention, which takes a filled cache "
       "(past > 0) with several new tokens only one sample at a time. Such a combination is refused at "
       "`check`; any other error onnxruntime raises on the data ends the compile with its message, and "
       "nothing is written.",
       'calibrate { data npz "cache.npz"  chunk 8 }   # past 96, 4 new tokens, a builder decoder'),
    # ---- Q5xx: verification ------------------------------------------------------------------------
    _c("Q418", "GPTQ raised its dampening, or fell back to rtn (warning)",
       "GPTQ inverts each layer's Hessian (2·XᵀX of its inputs) after adding 1% of its mean diagonal. When the "
       "Cholesky factorisation still fails (inputs that are constant or collinear over the calibration data), "
       "the dampening is raised tenfold, up to 10×, and a layer no dampening helps is rounded with rtn; each "
       "is listed instead of stopping the run or writing NaNs.",
       "calibrate { data synthetic { samples 1  seqlen 2 } }   # two tokens: H of rank 2"),
    _c("Q420", "the quantization_config qrc would write fails compressed-tensors' schema",
       "transformers and vLLM parse config.json's quantization_config with compressed-tensors' pydantic models; "
       "qrc checks its config with them before any work, so a config they would reject never becomes a folder. "
       "It signals a qrc bug.",
       "a scheme whose arguments compressed-tensors cannot express"),
    _c("Q421", "compressed-tensors is not installed: the config was not schema-checked (warning)",
       "Without the package qrc still writes the folder, but cannot prove that its quantization_config parses "
       "where it is served. The `hf` extra installs it.",
       "pip install qrc  (without [hf]), then qrc compile a torch recipe"),
    _c("Q422", "a transform changed the float model",
       "After folding, the float output on a calibration chunk is compared with the one before; a change beyond "
       "float error means a mapping's source feeds something its targets do not cover. The compile stops "
       "before anything is written.",
       'transform smoothquant { map "*.custom_norm" -> "*.q_proj" }   # on a family qrc cannot check by name'),
    _c("Q423", "the ONNX export does not match the plan",
       "An HF folder compiled on the ONNX backend is exported first, and the recipe is resolved again against "
       "the export. If the exporter named a layer differently, the layers quantized would silently differ "
       "from the plan; the compile stops instead, before any weight is rounded.",
       "backend onnx on a folder whose export renames its Linear weights"),
    _c("Q424", "the ONNX export failed",
       "An HF folder compiled on the ONNX backend is exported by torch.onnx in a child process. When the "
       "exporter fails (an operator it cannot export, a crash, too little memory) the compile stops with the "
       "exporter's last message; nothing is cached and nothing is written.",
       "backend onnx on a folder whose modelling code torch.onnx cannot trace"),
    _c("Q425", "the emitted ONNX model does not load in onnxruntime",
       "Before an ONNX output goes into place onnxruntime opens it (verification does, or, without `verify`, a "
       "session made for that; in offload the quantization nodes are checked against the model's opset); a "
       "model that fails would be a file nobody can open. It is a qrc bug; nothing is written.",
       "a DequantizeLinear attribute the model's opset does not define"),
    _c("Q426", "transformers would open the emitted folder with weights missing or unexpected",
       "Before a torch output goes into place, transformers opens it on the meta device (no weight is read) with "
       "the folder's task class and with AutoModel. A key it reports missing or unexpected, beyond what the float "
       "folder has, means the model would load with random or unquantized weights while verification (which "
       "measures qrc's own model) passes. It is a qrc bug; nothing is written.",
       "a quantization_config whose targets name checkpoint paths the loader's modules do not have"),
    _c("Q427", "the emitted folder was not opened with transformers (warning)",
       "The load check needs transformers and accelerate (to build a model on the meta device), and an "
       "architecture transformers knows; without them the folder is written unchecked, and this says so.",
       "a file-to-file compile of an architecture this transformers release does not have"),
    _c("Q428", "the emitted folder does not load or run as its users load it",
       "On the torch backend, verification runs the staged folder the way transformers loads it: its "
       "quantization_config applied by compressed-tensors, its tensors read and decompressed block by block. "
       "A tensor missing or of the wrong shape, a config compressed-tensors refuses, or a forward that fails "
       "there stops the compile with nothing written, instead of a figure measured on something else.",
       "a qrc bug; the diagnostic names the tensor or the error"),
    _c("Q429", "another compile is writing the same destination",
       "Two compiles into one path would mix their files; the first holds a lock beside the destination "
       "(`.<name>.qrc-lock`) until its model is in place, and the second stops before any work.",
       "qrc compile r.recipe -o out &  qrc compile r.recipe -o out"),
    _c("Q430", "side files linking outside the model folder were not copied (warning)",
       "A model folder's tokenizer and other side files are copied into the output only when they are regular "
       "files resolving inside the folder (or a Hugging Face cache snapshot's blobs): a link to a private key "
       "or a system file is never read, so its content cannot end up in a published model.",
       "model/tokenizer.json -> /home/me/.ssh/id_rsa"),
    _c("Q431", "what torchrun's ranks cannot share yet",
       "Under torchrun (or with `memory { ranks N }`) the calibration and held-out samples are split over the "
       "ranks by chunk, every statistic is merged exactly before rounding, the weights are rounded on the ranks "
       "and the first rank writes the output (safetensors, ONNX or GGUF). `mode multi_gpu` runs in one "
       "process so far: `qrc check` refuses it with `ranks N`, and under torchrun every rank refuses it "
       "before any work, instead of running it N times over.",
       "memory { mode multi_gpu  vram 2 x 80 GiB  ranks 2 }"),
    _c("Q432", "a rank of the compile stopped",
       "The ranks wait for each other at every merge. When one dies or is killed (out of memory, a signal, a "
       "lost node) the others stop too, at the next merge or when torchrun ends them, instead of waiting "
       "forever (a merge times out after QRC_RANK_TIMEOUT seconds, 600 by default); the first rank wrote "
       "nothing to the destination.",
       "kill -9 one of torchrun's workers during a compile"),
    _c("Q501", "verification failed",
       "The emitted model was run beside the float one on held-out samples and missed the recipe's bound. "
       "The model is left in place with a `.verify.json` report of the figures, so it can be inspected.",
       "verify { metric cosine at_least 0.999 }"),
    # ---- warnings ---------------------------------------------------------------------------------
    _c("Q502", "verified where int8 weights' integer kernel saturates (warning)",
       "onnxruntime runs a MatMul with uint8 activations and int8 weights with its U8S8 kernel. On x86 CPUs "
       "without VNNI (AVX2, AVX-512 without VNNI) that kernel adds pairs of products in 16 bits with saturation, "
       "so the served model can be less accurate there than on a CPU with VNNI. Verification runs the model as "
       "onnxruntime serves it on this CPU, so its figures include that loss; the warning says so. uint8 weights "
       "(`weights uint8 per_channel asymmetric`, the U8U8 kernel) add in 32 bits on every x86 CPU.",
       'quantize { "*" -> W8A8 }   # verified on an AVX2 CPU'),
    _c("Q235", "group size does not divide a layer's input features",
       "Group-wise quantization splits each row into blocks of `group N` input features; a layer whose "
       "input features are not a multiple of N cannot be split evenly.",
       "scheme w4 = W4A16 { group 128 }   # on a layer with 344 input features"),
    _c("Q236", "activation quantization on an Embedding",
       "An Embedding's input is token ids, which are not quantized; only its weight table can be.",
       'quantize { "*" -> W8A8 }   # "*" includes model.embed_tokens'),
    _c("Q237", "MatMulNBits on a layer that is not a MatMul",
       "onnxruntime's MatMulNBits replaces MatMul only; Conv and Embedding (Gather) layers cannot be emitted "
       "with it.",
       'quantize { "*" -> w4 }\nemit "m.onnx" { format matmul_nbits }   # "*" includes the embeddings'),
    _c("Q238", "a GPTQ option without gptq, or with one it excludes",
       "`act_order` orders GPTQ's columns by decreasing Hessian diagonal; `static_groups` / `updated_groups` "
       "say where a group's scale comes from (the float weight, or the columns as the loop reaches the "
       "group); `mse_scales` / `minmax_scales` how it is chosen there (the range's shrink with the least "
       "squared error, or the min/max range). They mean nothing for rtn or mse, and `updated_groups` cannot go with `act_order`: groups "
       "visited out of order need a group index the formats do not carry.",
       "rounding mse act_order"),
    _c("Q253", "an input synthetic data cannot fill",
       "`data synthetic` draws token ids from the model's vocabulary (the embedding an input indexes, or the "
       "config's vocab_size), sets masks to ones and positions counting up. An integer input qrc cannot "
       "place in a range is refused instead of being fed zeros, which would calibrate on one constant "
       "sequence and make verification meaningless.",
       'model "folder-with-pixel-values-and-ids"  calibrate { data synthetic { samples 8 } }'),
    _c("Q254", "accuracy_level outside 0–4, or without MatMulNBits",
       "`emit { accuracy_level N }` sets the type MatMulNBits computes its activations in: 0 unset, 1 fp32, "
       "2 fp16, 3 bf16, 4 int8 (default: onnxruntime's fast CPU path, what onnxruntime-genai's builder writes). "
       "Other formats have no such setting; the value is ignored there with a warning.",
       'emit "out/model.onnx" { format qdq accuracy_level 4 }'),
    _c("Q255", "GPTQ Hessians from fewer calibration tokens than twice the inputs (warning)",
       "GPTQ rounds each layer against H = 2·XᵀX of its calibration inputs, a K×K matrix for K input "
       "features. With fewer tokens than K it is rank-deficient, and up to about 2·K poorly determined: GPTQ "
       "then fits the calibration tokens and can round unseen inputs worse than rtn (measured at 0.36·K and "
       "1.09·K; better than rtn at 1.45·K).",
       "calibrate { data synthetic { samples 4  seqlen 128 } }   # 512 tokens, down_proj with 1408 inputs"),
    _c("Q247", "a rule quantizes MoE routers (warning)",
       "A router (`mlp.gate`) turns each token's hidden state into the scores that pick its experts; rounding it "
       "changes which experts run. llm-compressor, AutoRound and vLLM's recipes keep routers in float.",
       'quantize { type Linear -> W4A16 }   # on a Mixtral or Qwen3-MoE folder'),
    _c("Q266", "MoE experts stored fused stay float (warning)",
       "Some checkpoints (Gemma 4's MoE) store a block's experts as 3-D tensors (`experts.gate_up_proj`, "
       "`experts.down_proj`) rather than one Linear per expert. qrc quantizes per-expert Linears only, so these "
       "experts are copied in float: the warning says so instead of leaving them silently unquantized.",
       'quantize { type Linear -> W4A16 }   # on a Gemma 4 MoE folder'),
    _c("Q267", "a scheme vLLM will not load (warning)",
       "vLLM picks a kernel scheme for each config group from its weight and input arguments; for some "
       "combinations (NVFP4 weights with FP8 inputs, microscaling formats, asymmetric int8 weight-only…) it has "
       "none and refuses the folder. qrc checks its config with the same rules before any work.",
       "scheme s { weights nvfp4  activations fp8 per_token dynamic }"),
    _c("Q268", "input groups that do not divide a layer's input features",
       "A scheme with dynamic inputs in groups (FP8_BLOCK: 128 columns per scale) needs every quantized layer's "
       "input width to be a multiple of the group: compressed-tensors' forward, which transformers runs on the "
       "loaded folder, splits each input row into whole groups and fails otherwise.",
       'quantize { type Linear -> FP8_BLOCK }   # on a model whose hidden size is 64'),
    _c("Q433", "the recipe's `ranks` differs from the processes the compile runs as (warning)",
       "`memory { ranks N }` is what `qrc plan` plans for: each rank's share of the samples and its peak. A "
       "compile runs as it was launched (alone, or as torchrun's ranks) and plans again for that, saying so.",
       "memory { ranks 2 }   # compiled without torchrun"),
    _c("Q248", "an MoE expert saw no calibration token (warning)",
       "With `calibrate { experts routed }` an expert the router never chose has no statistics: its weights "
       "are rounded with rtn and a static input borrows the widest range of its sibling experts, instead of a "
       "Hessian or a scale made of nothing. `experts all` (the default) sends every token through every expert.",
       "a 64-expert block calibrated on 8 short samples"),
    _c("Q249", "a rule quantizes a weight that is not a float tensor with elements",
       "An int8, uint8, int32 or fp8 weight is already quantized (or is not a weight at all), and a weight with a "
       "zero-size dimension has nothing to round; rounding either would write nonsense or fail mid-run.",
       'quantize { type Linear -> W8A16 }   # on a model whose MatMul weights are int8 already'),
    _c("Q250", "model cannot be found or read",
       "The recipe's model is not a readable .onnx file, HF-style folder or built-in. Relative paths are "
       "relative to the current folder.",
       'model "models/missing.onnx"'),
    _c("Q251", "unknown built-in model or parameter",
       "Built-ins are tiny-llama, tiny-bert and tiny-cnn, sized with `?key=value&…` parameters (whole "
       "numbers) that must describe a valid architecture.",
       'model "builtin:tiny-llama?layerz=4"'),
    _c("Q252", "model folder qrc cannot index",
       "A folder needs safetensors weights, or a config.json of a family qrc knows (llama, mistral, granite, "
       "qwen2, qwen3, olmo2, gemma2, gemma3_text, phi3, mixtral, qwen3_moe, deepseek_v3, bert) to be indexed "
       "from the config alone. An FP8 source checkpoint whose `weight_scale_inv` tensors do not tile their "
       "weights by `weight_block_size` is refused too: read anyway, most blocks would take the wrong scale.",
       'model "checkpoints/"   # no *.safetensors, unknown model_type'),
    _c("Q256", "a floating format with a setting it cannot take",
       "FP8, NVFP4 and MX formats are symmetric and rounded as compressed-tensors defines them (rtn). NVFP4 "
       "scales blocks of 16 and MX blocks of 32 (the format fixes the group); fp8 weights are per tensor, per "
       "channel or in `block RxC` tiles; fp8 activations are symmetric, static per tensor or dynamic (per token "
       "or per group); integer and floating types do not mix within a scheme.",
       "scheme s { weights mxfp4 asymmetric }"),
    _c("Q257", "a floating format on the ONNX backend",
       "onnxruntime's CPU build has no float8 matrix multiply and no FP4 type: a float8 QDQ graph would run "
       "dequantized, in float. The formats are written by the torch backend as compressed-tensors folders, "
       "which vLLM and transformers load.",
       'recipe r { model "model.onnx"  quantize { type Linear -> FP8_DYNAMIC } }'),
    _c("Q258", "fused siblings at different schemes (warning)",
       "vLLM computes q/k/v of an attention block, and gate/up of an MLP or of one MoE expert, as one fused layer "
       "with one quantization scheme; a torch folder whose siblings differ does not load there (transformers "
       "loads it). `group auto` gives each instance the widest member's scheme.",
       'quantize { type Linear -> W4A16  "*.v_proj" -> W8A16 }   # without `group auto`'),
    _c("Q259", "a transform setting it cannot take",
       "`transform smoothquant` takes `alpha` in [0, 1]; `transform awq` takes `grid` (1 to 1000) and "
       "`duo_scaling on|off`. A setting of the other method would otherwise be ignored.",
       "transform awq { alpha 0.5 }"),
    _c("Q260", "a transform mapping matches nothing",
       "A `map` pattern that matches no norm or layer, or a transform that infers no mapping for the model, "
       "would leave the outliers where they are after a long run. The help lists the closest names.",
       'transform awq { map "*.input_norm" -> "*.q_proj" }   # the norms are *.input_layernorm'),
    _c("Q261", "a mapping's source does not feed its targets",
       "The scales divide the source's output and multiply the targets' input columns: that is the same model "
       "only when the targets read exactly that output (same block, same width) and every layer reading it is a "
       "target. v_proj → o_proj under grouped-query attention fails the width check.",
       'transform smoothquant { map "*.input_layernorm" -> "*.q_proj", "*.k_proj" }   # v_proj reads it too'),
    _c("Q262", "a mapping's targets have different schemes",
       "One set of scales serves every target of a mapping; AWQ searches them for one rounding, and fused "
       "q/k/v kernels need one scheme. Float targets take the scales exactly and do not count.",
       'quantize { type Linear -> W4A16  "*.q_proj" -> W8A16 }\ntransform awq'),
    _c("Q263", "a mapping scales only float layers (warning)",
       "Its targets are not quantized, so the mapping would change nothing that is rounded; it is skipped.",
       'transform awq { map "model.norm" -> "lm_head" }   # lm_head stays float'),
    _c("Q264", "a source the ONNX graph cannot absorb the scale into",
       "Where the model has a graph (an ONNX file, a built-in), it shows everything a norm's output feeds: one "
       "that also reaches a residual Add (a post-norm block, as in BERT) cannot take a scale without changing "
       "the model. The ONNX backend folds scales into norm initializers only, so a MatMul source is refused "
       "there too (use `backend torch`).",
       'model "builtin:tiny-bert"\ntransform smoothquant { map "*.attention.output.LayerNorm" -> "*.intermediate.dense" }'),
    _c("Q265", "QDQ weights that need a newer ONNX opset than the model's",
       "DequantizeLinear takes 4-bit types and group (`block_size`) scales from opset 21 on; onnxruntime refuses "
       "to load a model of an older opset that has them, so qrc would write a file nobody can open. MatMulNBits "
       "(a contrib op) carries W4A16 group schemes at any opset.",
       'model "model-opset17.onnx"  quantize { type Linear -> W4A16 }  emit "out.onnx" { format qdq }'),
    _c("Q233", "emit path with an unexpected extension (warning)",
       "Runtimes and tools look for `.onnx` files; another extension is allowed but probably a typo.",
       'emit "out/model.onx"'),
    _c("Q244", "group instances miss members (warning)",
       "An instance lacks a member the pattern names (a model with no v_proj, or a misspelled member); the "
       "members that exist are still aligned.",
       'group "*.self_attn.{q,k,v,w}_proj"'),
    _c("Q245", "`group auto` found nothing (warning)",
       "The model has no layers named like the projections the group aligns (qkv: q/k/v_proj, query/key/value, "
       "Wq/Wk/Wv; gate_up: gate_proj/up_proj, w1/w3), and none fused already, so the group constrains nothing.",
       "model \"builtin:tiny-cnn\"\ngroup auto qkv"),
    _c("Q246", "mixed precision has nothing to search (warning)",
       "Only layers whose winning rule gives one of the choices are searched; when no rule does, every "
       "layer keeps its rule's scheme and the search does nothing.",
       "quantize { \"*\" -> W8A8 }\nmixed_precision { choices [w4, w8] budget 5 bits }"),
    _c("Q239", "report path qrc cannot write",
       "`--report` writes HTML (a path ending in .html) or Markdown (.md); another extension or a folder "
       "is refused before any work, so a long compile never ends without its report.",
       "qrc compile r.recipe --report out/report.pdf"),
    _c("Q240", "scheme never used (warning)",
       "A scheme no rule or choice names has no effect; often a rule names the wrong scheme.",
       "scheme w8 { weights int8 }   # and no rule -> w8"),
    _c("Q241", "no quantize rules (warning)",
       "Without rules every layer stays in float and the compile produces a copy of the model.",
       "recipe r { model \"builtin:tiny-llama\" }"),
    _c("Q242", "chunk larger than the sample count (warning)",
       "A chunk is a number of samples per forward pass; it is clamped to the sample count.",
       "calibrate { data synthetic { samples 8 } chunk 16 }"),
    _c("Q243", "bit budget allows the widest choice everywhere (warning)",
       "With a budget at or above every searched layer at its widest choice (storage bits, scales "
       "included) the search has nothing to trade and assigns the widest scheme everywhere.",
       "mixed_precision { choices [w4, w8] budget 9 bits }"),
)

BY_CODE = {info.code: info for info in CODES}
