"""Diagnostic codes, Q5xx: verification of the emitted model."""

from __future__ import annotations

from compiler.codes.info import CodeInfo

VERIFICATION: tuple[CodeInfo, ...] = (
    CodeInfo("Q418", "GPTQ raised its dampening, or fell back to rtn (warning)",
             "GPTQ inverts each layer's Hessian (2·XᵀX of its inputs) after adding 1% of its mean diagonal. When the "
             "Cholesky factorisation still fails (inputs that are constant or collinear over the calibration data), "
             "the dampening is raised tenfold, up to 10×, and a layer no dampening helps is rounded with rtn; each "
             "is listed instead of stopping the run or writing NaNs.",
             "calibrate { data synthetic { samples 1  seqlen 2 } }   # two tokens: H of rank 2"),
    CodeInfo("Q420", "the quantization_config qrc would write fails compressed-tensors' schema",
             "transformers and vLLM parse config.json's quantization_config with compressed-tensors' pydantic models; "
             "qrc checks its config with them before any work, so a config they would reject never becomes a folder. "
             "It signals a qrc bug.",
             "a scheme whose arguments compressed-tensors cannot express"),
    CodeInfo("Q421", "compressed-tensors is not installed: the config was not schema-checked (warning)",
             "Without the package qrc still writes the folder, but cannot prove that its quantization_config parses "
             "where it is served. The `hf` extra installs it.",
             "pip install qrc  (without [hf]), then qrc compile a torch recipe"),
    CodeInfo("Q422", "a transform changed the float model",
             "After folding, the float output on a calibration chunk is compared with the one before; a change beyond "
             "float error means a mapping's source feeds something its targets do not cover. A rotated ONNX graph is "
             "compared on a few synthetic tokens: a change means its heads are not what the config beside it says "
             "(R2 would turn values across heads), or something reads the residual stream that the rotation does not "
             "fold. The compile stops before anything is written.",
             'transform smoothquant { map "*.custom_norm" -> "*.q_proj" }   # on a family qrc cannot check by name'),
    CodeInfo("Q423", "the ONNX export does not match the plan",
             "An HF folder compiled on the ONNX backend is exported first, and the recipe is resolved again against "
             "the export. If the exporter named a layer differently, the layers quantized would silently differ "
             "from the plan; the compile stops instead, before any weight is rounded.",
             "backend onnx on a folder whose export renames its Linear weights"),
    CodeInfo("Q424", "the ONNX export failed",
             "An HF folder compiled on the ONNX backend is exported by torch.onnx in a child process. When the "
             "exporter fails (an operator it cannot export, a crash, too little memory) the compile stops with the "
             "exporter's last message; nothing is cached and nothing is written.",
             "backend onnx on a folder whose modelling code torch.onnx cannot trace"),
    CodeInfo("Q425", "the emitted ONNX model does not load in onnxruntime",
             "Before an ONNX output goes into place onnxruntime opens it (verification does, or, without `verify`, a "
             "session made for that; in offload the quantization nodes are checked against the model's opset); a "
             "model that fails would be a file nobody can open. It is a qrc bug; nothing is written.",
             "a DequantizeLinear attribute the model's opset does not define"),
    CodeInfo("Q426", "transformers would open the emitted folder with weights missing or unexpected",
             "Before a torch output goes into place, transformers opens it on the meta device (no weight is read) with "
             "the folder's task class and with AutoModel. A key it reports missing or unexpected, beyond what the float "
             "folder has, means the model would load with random or unquantized weights while verification (which "
             "measures qrc's own model) passes. It is a qrc bug; nothing is written.",
             "a quantization_config whose targets name checkpoint paths the loader's modules do not have"),
    CodeInfo("Q427", "the emitted folder was not opened with transformers (warning)",
             "The load check needs transformers and accelerate (to build a model on the meta device), and an "
             "architecture transformers knows; without them the folder is written unchecked, and this says so.",
             "a file-to-file compile of an architecture this transformers release does not have"),
    CodeInfo("Q428", "the emitted folder does not load or run as its users load it",
             "On the torch backend, verification runs the staged folder the way transformers loads it: its "
             "quantization_config applied by compressed-tensors, its tensors read and decompressed block by block. "
             "A tensor missing or of the wrong shape, a config compressed-tensors refuses, or a forward that fails "
             "there stops the compile with nothing written, instead of a figure measured on something else.",
             "a qrc bug; the diagnostic names the tensor or the error"),
    CodeInfo("Q429", "another compile is writing the same destination",
             "Two compiles into one path would mix their files; the first holds a lock beside the destination "
             "(`.<name>.qrc-lock`) until its model is in place, and the second stops before any work.",
             "qrc compile r.recipe -o out &  qrc compile r.recipe -o out"),
    CodeInfo("Q430", "side files linking outside the model folder were not copied (warning)",
             "A model folder's tokenizer and other side files are copied into the output only when they are regular "
             "files resolving inside the folder (or a Hugging Face cache snapshot's blobs): a link to a private key "
             "or a system file is never read, so its content cannot end up in a published model.",
             "model/tokenizer.json -> /home/me/.ssh/id_rsa"),
    CodeInfo("Q431", "what torchrun's ranks cannot share yet",
             "Under torchrun (or with `memory { ranks N }`) the calibration and held-out samples are split over the "
             "ranks by chunk, every statistic is merged exactly before rounding, the weights are rounded on the ranks "
             "and the first rank writes the output (safetensors, ONNX or GGUF). `mode multi_gpu` runs in one "
             "process so far, and so does `rounding autoround` (each rank would learn from its own share of the "
             "samples): `qrc check` refuses them with `ranks N`, and under torchrun every rank refuses them "
             "before any work, instead of running them N times over.",
             "memory { mode multi_gpu  vram 2 x 80 GiB  ranks 2 }"),
    CodeInfo("Q432", "a rank of the compile stopped",
             "The ranks wait for each other at every merge. When one dies or is killed (out of memory, a signal, a "
             "lost node) the others stop too, at the next merge or when torchrun ends them, instead of waiting "
             "forever (a merge times out after QRC_RANK_TIMEOUT seconds, 600 by default); the first rank wrote "
             "nothing to the destination.",
             "kill -9 one of torchrun's workers during a compile"),
    CodeInfo("Q501", "verification failed",
             "The emitted model was run beside the float one on held-out samples and missed the recipe's bound. "
             "The model is left in place with a `.verify.json` report of the figures, so it can be inspected.",
             "verify { metric cosine at_least 0.999 }"),
)
