"""Diagnostic codes, The warnings of every stage (a code of its stage's range, severity warning)."""

from __future__ import annotations

from compiler.codes.info import CodeInfo

WARNINGS: tuple[CodeInfo, ...] = (
    CodeInfo("Q502", "verified where int8 weights' integer kernel saturates (warning)",
             "onnxruntime runs a MatMul with uint8 activations and int8 weights with its U8S8 kernel. On x86 CPUs "
             "without VNNI (AVX2, AVX-512 without VNNI) that kernel adds pairs of products in 16 bits with saturation, "
             "so the served model can be less accurate there than on a CPU with VNNI. Verification runs the model as "
             "onnxruntime serves it on this CPU, so its figures include that loss; the warning says so. uint8 weights "
             "(`weights uint8 per_channel asymmetric`, the U8U8 kernel) add in 32 bits on every x86 CPU.",
             'quantize { "*" -> W8A8 }   # verified on an AVX2 CPU'),
    CodeInfo("Q235", "group size does not divide a layer's input features",
             "Group-wise quantization splits each row into blocks of `group N` input features; a layer whose "
             "input features are not a multiple of N cannot be split evenly.",
             "scheme w4 = W4A16 { group 128 }   # on a layer with 344 input features"),
    CodeInfo("Q236", "activation quantization on an Embedding",
             "An Embedding's input is token ids, which are not quantized; only its weight table can be.",
             'quantize { "*" -> W8A8 }   # "*" includes model.embed_tokens'),
    CodeInfo("Q237", "MatMulNBits on a layer that is not a MatMul",
             "onnxruntime's MatMulNBits replaces MatMul only; Conv and Embedding (Gather) layers cannot be emitted "
             "with it.",
             'quantize { "*" -> w4 }\nemit "m.onnx" { format matmul_nbits }   # "*" includes the embeddings'),
    CodeInfo("Q238", "a GPTQ option without gptq, or with one it excludes",
             "`act_order` (the default) / `no_act_order` order GPTQ's columns by decreasing Hessian diagonal or keep "
             "their stored order; `static_groups` / `updated_groups` "
             "say where a group's scale comes from (the float weight, or the columns as the loop reaches the "
             "group); `mse_scales` / `minmax_scales` how it is chosen there (the range's shrink with the least "
             "squared error, or the min/max range). They mean nothing for rtn or mse, and `updated_groups` cannot go with `act_order`: groups "
             "visited out of order need a group index the formats do not carry.",
             "rounding mse act_order"),
    CodeInfo("Q253", "an input synthetic data cannot fill",
             "`data synthetic` draws token ids from the model's vocabulary (the embedding an input indexes, or the "
             "config's vocab_size), sets masks to ones and positions counting up. An integer input qrc cannot "
             "place in a range is refused instead of being fed zeros, which would calibrate on one constant "
             "sequence and make verification meaningless.",
             'model "folder-with-pixel-values-and-ids"  calibrate { data synthetic { samples 8 } }'),
    CodeInfo("Q254", "accuracy_level outside 0–4, or without MatMulNBits",
             "`emit { accuracy_level N }` sets the type MatMulNBits computes its activations in: 0 unset, 1 fp32, "
             "2 fp16, 3 bf16, 4 int8 (default: onnxruntime's fast CPU path, what onnxruntime-genai's builder writes). "
             "Other formats have no such setting; the value is ignored there with a warning.",
             'emit "out/model.onnx" { format qdq accuracy_level 4 }'),
    CodeInfo("Q255", "GPTQ Hessians from fewer calibration tokens than twice the inputs (warning)",
             "GPTQ rounds each layer against H = 2·XᵀX of its calibration inputs, a K×K matrix for K input "
             "features. With fewer tokens than K it is rank-deficient, and up to about 2·K poorly determined: GPTQ "
             "then fits the calibration tokens and can round unseen inputs worse than rtn (measured at 0.36·K and "
             "1.09·K; better than rtn at 1.45·K).",
             "calibrate { data synthetic { samples 4  seqlen 128 } }   # 512 tokens, down_proj with 1408 inputs"),
    CodeInfo("Q247", "a rule quantizes MoE routers (warning)",
             "A router (`mlp.gate`) turns each token's hidden state into the scores that pick its experts; rounding it "
             "changes which experts run. llm-compressor, AutoRound and vLLM's recipes keep routers in float.",
             'quantize { type Linear -> W4A16 }   # on a Mixtral or Qwen3-MoE folder'),
    CodeInfo("Q266", "MoE experts stored fused stay float (warning)",
             "Some checkpoints (Gemma 4's MoE, gpt-oss, GraniteMoE's `input_linear`/`output_linear`) store a "
             "block's experts as 3-D tensors (`experts.gate_up_proj`, `experts.down_proj`, or any 3-D tensor whose "
             "first axis counts the config's experts) rather than one Linear per expert. qrc quantizes per-expert "
             "Linears only, so these experts are copied in float: the warning says so instead of leaving them "
             "silently unquantized. Where transformers opens a quantized folder of the family with one Linear per "
             "expert (Llama 4), qrc reads each expert's projections as slices of the fused tensors and writes them "
             "so, quantized like any layer; a fused tensor of another shape there would not load, and `Q411` "
             "refuses the recipe. gpt-oss's MXFP4 experts (its releases) are decoded to the model's float dtype: "
             "transformers loads one quantization method per folder. To GGUF, gpt-oss's experts are no warning: "
             "they are indexed per expert there (llama.cpp merges them), and rules round them.",
             'quantize { type Linear -> W4A16 }   # on a Gemma 4 MoE folder'),
    CodeInfo("Q267", "a scheme vLLM will not load (warning)",
             "vLLM picks a kernel scheme for each config group from its weight and input arguments; for some "
             "combinations (NVFP4 weights with FP8 inputs, microscaling formats, asymmetric int8 weight-only…) it has "
             "none and refuses the folder. qrc checks its config with the same rules before any work.",
             "scheme s { weights nvfp4  activations fp8 per_token dynamic }"),
    CodeInfo("Q268", "input groups that do not divide a layer's input features",
             "A scheme with dynamic inputs in groups (FP8_BLOCK: 128 columns per scale) needs every quantized layer's "
             "input width to be a multiple of the group: compressed-tensors' forward, which transformers runs on the "
             "loaded folder, splits each input row into whole groups and fails otherwise.",
             'quantize { type Linear -> FP8_BLOCK }   # on a model whose hidden size is 64'),
    CodeInfo("Q433", "the recipe's `ranks` differs from the processes the compile runs as (warning)",
             "`memory { ranks N }` is what `qrc plan` plans for: each rank's share of the samples and its peak. A "
             "compile runs as it was launched (alone, or as torchrun's ranks) and plans again for that, saying so.",
             "memory { ranks 2 }   # compiled without torchrun"),
    CodeInfo("Q248", "an MoE expert saw no calibration token (warning)",
             "With `calibrate { experts routed }` an expert the router never chose has no statistics: its weights "
             "are rounded with rtn and a static input borrows the widest range of its sibling experts, instead of a "
             "Hessian or a scale made of nothing. `experts all` (the default) sends every token through every expert.",
             "a 64-expert block calibrated on 8 short samples"),
    CodeInfo("Q249", "a rule quantizes a weight that is not a float tensor with elements",
             "An int8, uint8, int32 or fp8 weight is already quantized (or is not a weight at all), and a weight with a "
             "zero-size dimension has nothing to round; rounding either would write nonsense or fail mid-run.",
             'quantize { type Linear -> W8A16 }   # on a model whose MatMul weights are int8 already'),
    CodeInfo("Q250", "model cannot be found or read",
             "The recipe's model is not a readable .onnx file, HF-style folder or built-in. Relative paths are "
             "relative to the current folder. A folder's model.safetensors.index.json must map tensor names to "
             "shard files in the folder that are there. Also qrc's cache folder (`$QRC_CACHE`) that is no folder it can "
             "write, and a `$QRC_CACHE_LIMIT` that is no size (such as `20GiB`).",
             'model "models/missing.onnx"'),
    CodeInfo("Q251", "unknown built-in model or parameter",
             "Built-ins are tiny-llama, tiny-bert and tiny-cnn, sized with `?key=value&…` parameters (whole "
             "numbers) that must describe a valid architecture.",
             'model "builtin:tiny-llama?layerz=4"'),
    CodeInfo("Q252", "model folder qrc cannot index",
             "A folder needs safetensors weights, or a config.json of a family qrc knows (llama, mistral, granite, "
             "qwen2, qwen3, olmo2, gemma2, gemma3_text, phi3, mixtral, qwen3_moe, deepseek_v3, bert) to be indexed "
             "from the config alone. An FP8 source checkpoint whose `weight_scale_inv` tensors do not tile their "
             "weights by `weight_block_size` is refused too: read anyway, most blocks would take the wrong scale. "
             "So is an MXFP4 checkpoint (gpt-oss's) whose expert tensor's `_blocks` lacks its `_scales` or "
             "disagrees with them in shape: the message names the tensor.",
             'model "checkpoints/"   # no *.safetensors, unknown model_type'),
    CodeInfo("Q271", "a GGUF file qrc cannot read as a model",
             "A .gguf source is read from its header alone and seen as the Hugging Face folder it was converted from: "
             "Llama, Mistral, Qwen2 and Qwen3 files with a byte-level BPE vocabulary (gpt2), every tensor of a type "
             "the gguf package dequantizes. Another architecture, a sentencepiece vocabulary, a tensor with no "
             "place in the layout, or a damaged header is refused before any work.",
             'model "phi-2.Q4_0.gguf"   # architecture phi2'),
    CodeInfo("Q272", "the importance-weighted search on the ONNX backend",
             "`rounding imatrix` on integer weights searches each group's clipping with every input column's error "
             "weighted by that column's mean square over the calibration tokens; the torch backend gathers those "
             "while it calibrates, the ONNX backend gathers Hessians for GPTQ only.",
             'backend onnx  scheme s = W4A16 { group 64  rounding imatrix }'),
    CodeInfo("Q273", "a rotation the model, backend or output cannot take",
             "`transform quarot` folds random Hadamard rotations of the residual stream (R1) and of each head's values "
             "(R2) into the weights. It needs a Llama-family decoder whose norms are RMSNorms before attention and MLP "
             "(Gemma's post-norms and LayerNorm do not commute with it) and widths a Hadamard matrix is built for "
             "(2^k times up to two Paley orders); the mixed-precision search's cached scores are of the unrotated "
             "weights. The torch backend writes a safetensors folder. The ONNX backend rotates a copy of the whole "
             "graph (not in `mode offload`, whose segments are cut from the unrotated one), whose every reader and "
             "writer of the residual stream must be a MatMul the rotation folds (a Gemm's own bias on v, o or down is not rotated; an Add's bias is). "
             "`block N` must divide every width it turns; on torch, `online r4` needs a runtime that applies the "
             "folder's transform_config (vLLM; not transformers' loader), while an ONNX graph runs it itself. "
             "`transform spinquant` learns its rotations by training a transformers model on calibration text: not "
             "on synthetic tokens, a built-in model or the ONNX backend.",
             'backend onnx  transform quarot  memory { mode offload }'),
    CodeInfo("Q274", "learned rounding the scheme, layer or backend cannot take",
             "`rounding autoround` learns each weight's rounding offset and each group's clipping by sign-SGD, one "
             "decoder block at a time, against the block's float outputs on the calibration samples. It needs "
             "integer weights in groups or per channel, layers inside the model's blocks (a head or embedding has no "
             "block to learn against), calibration data and the torch backend; `lr` is in (0, 1].",
             'scheme s = NVFP4A16 { rounding autoround }'),
    CodeInfo("Q275", "the output does not run where `emit` says it must",
             "`emit … { runtime NAME  device cpu|gpu }` names where the output will run; qrc checks the runtime table "
             "(docs/runtimes.md: which runtimes load each output on which device, kept true by tests and bench runs) "
             "before any work, so a folder vLLM's CPU build has no kernel for, or a GGUF file given to vLLM, stops at "
             "`qrc check`. Without `device` the target is this machine's device (a GPU where one is found). `device` "
             "needs a `runtime`.",
             'quantize { type Linear -> NVFP4 }  emit "out" { runtime vllm  device cpu }'),
    CodeInfo("Q276", "an asymmetric pack-quantized folder transformers' default load refuses",
             "compressed-tensors packs the zero points of asymmetric integer weights (per channel or in groups) eight "
             "to an int32, as vLLM reads them; transformers 5.24 with compressed-tensors 0.20.1 builds the model with "
             "them unpacked, so its default load stops at a size mismatch (`dequantize=True` loads the folder). qrc "
             "says so at check: an error where `verify` would run the folder as that load builds it, after the work; "
             "a warning otherwise (vLLM serves the folder).",
             'model "my-llama"  scheme s = W4A16 { asymmetric }  quantize { type Linear -> s }'),
    CodeInfo("Q277", "float zero points where the output holds integers",
             "`rounding hqq` optimises each group's zero point by half-quadratic splitting, to a value between the "
             "integers. onnxruntime's MatMulNBits stores zero points in the scales' float type, so the ONNX backend "
             "writes them as found, for 4-bit integer weights in groups with `asymmetric` and no quantized "
             "activations, on MatMul nodes with `emit { format matmul_nbits }`. compressed-tensors, DequantizeLinear "
             "and GGUF store integer zero points: rounded, the gain is lost (on the real SmolLM2 it gave rtn's "
             "perplexity back), so qrc refuses instead.",
             'backend torch  scheme s = W4A16 { group 64  asymmetric  rounding hqq }'),
    CodeInfo("Q278", "a learned-rounding step smaller than its `batch` (warning)",
             "Each sign-SGD step of `rounding autoround` draws its `batch` samples from one calibration chunk (the "
             "block's inputs are kept chunk by chunk), so a chunk smaller than the batch runs steps of the chunk's "
             "samples: fewer samples a step than asked, and less time and memory than a full batch. The plan counts "
             "the steps as they run.",
             'rounding autoround { batch 8 }  calibrate { data text "calib.txt"  chunk 4 }'),
    CodeInfo("Q256", "a floating format with a setting it cannot take",
             "FP8, NVFP4 and MX formats are symmetric and rounded as compressed-tensors defines them (rtn; NVFP4 "
             "and MXFP4 also with `mse` or `imatrix`, which search each block's scale, or `gptq`). NVFP4 "
             "scales blocks of 16 and MX blocks of 32 (the format fixes the group); fp8 weights are per tensor, per "
             "channel or in `block RxC` tiles; fp8 activations are symmetric, static per tensor or dynamic (per token "
             "or per group); integer and floating types do not mix within a scheme.",
             "scheme s { weights mxfp4 asymmetric }"),
    CodeInfo("Q257", "a floating format on the ONNX backend",
             "onnxruntime's CPU build has no float8 matrix multiply and no FP4 type: a float8 QDQ graph would run "
             "dequantized, in float. The formats are written by the torch backend as compressed-tensors folders, "
             "which vLLM and transformers load.",
             'recipe r { model "model.onnx"  quantize { type Linear -> FP8_DYNAMIC } }'),
    CodeInfo("Q258", "fused siblings at different schemes (warning)",
             "vLLM computes q/k/v of an attention block, and gate/up of an MLP or of one MoE expert, as one fused layer "
             "with one quantization scheme; a torch folder whose siblings differ does not load there (transformers "
             "loads it). `group auto` gives each instance the widest member's scheme.",
             'quantize { type Linear -> W4A16  "*.v_proj" -> W8A16 }   # without `group auto`'),
    CodeInfo("Q259", "a transform setting it cannot take",
             "`transform smoothquant` takes `alpha` in [0, 1] or `alpha search` (and, searching, `grid`); "
             "`transform awq` takes `grid` (1 to 1000) and `duo_scaling on|off`. A setting of the other method "
             "would otherwise be ignored.",
             "transform awq { alpha 0.5 }"),
    CodeInfo("Q260", "a transform mapping matches nothing",
             "A `map` pattern that matches no norm or layer, or a transform that infers no mapping for the model, "
             "would leave the outliers where they are after a long run. The help lists the closest names.",
             'transform awq { map "*.input_norm" -> "*.q_proj" }   # the norms are *.input_layernorm'),
    CodeInfo("Q261", "a mapping's source does not feed its targets",
             "The scales divide the source's output and multiply the targets' input columns: that is the same model "
             "only when the targets read exactly that output (same block, same width) and every layer reading it is a "
             "target. v_proj → o_proj under grouped-query attention fails the width check.",
             'transform smoothquant { map "*.input_layernorm" -> "*.q_proj", "*.k_proj" }   # v_proj reads it too'),
    CodeInfo("Q262", "a mapping's targets have different schemes",
             "One set of scales serves every target of a mapping; AWQ searches them for one rounding, and fused "
             "q/k/v kernels need one scheme. Float targets take the scales exactly and do not count.",
             'quantize { type Linear -> W4A16  "*.q_proj" -> W8A16 }\ntransform awq'),
    CodeInfo("Q263", "a mapping scales only float layers (warning)",
             "Its targets are not quantized, so the mapping would change nothing that is rounded; it is skipped.",
             'transform awq { map "model.norm" -> "lm_head" }   # lm_head stays float'),
    CodeInfo("Q264", "a source the ONNX graph cannot absorb the scale into",
             "Where the model has a graph (an ONNX file, a built-in), it shows everything a norm's output feeds: one "
             "that also reaches a residual Add (a post-norm block, as in BERT) cannot take a scale without changing "
             "the model. The ONNX backend folds scales into norm initializers, and into a MatMul only where the graph "
             "shows its output reaching one other MatMul through the gated product alone (an MLP's up → down: the up "
             "projection's output channels divide, the down projection's rows multiply); any other MatMul source is "
             "refused there (use `backend torch`).",
             'model "builtin:tiny-bert"\ntransform smoothquant { map "*.attention.output.LayerNorm" -> "*.intermediate.dense" }'),
    CodeInfo("Q265", "QDQ weights that need a newer ONNX opset than the model's",
             "DequantizeLinear takes 4-bit types and group (`block_size`) scales from opset 21 on; onnxruntime refuses "
             "to load a model of an older opset that has them, so qrc would write a file nobody can open. MatMulNBits "
             "(a contrib op) carries W4A16 group schemes at any opset.",
             'model "model-opset17.onnx"  quantize { type Linear -> W4A16 }  emit "out.onnx" { format qdq }'),
    CodeInfo("Q233", "emit path with an unexpected extension (warning)",
             "Runtimes and tools look for `.onnx` files; another extension is allowed but probably a typo.",
             'emit "out/model.onx"'),
    CodeInfo("Q244", "group instances miss members (warning)",
             "An instance lacks a member the pattern names (a model with no v_proj, or a misspelled member); the "
             "members that exist are still aligned.",
             'group "*.self_attn.{q,k,v,w}_proj"'),
    CodeInfo("Q245", "`group auto` found nothing (warning)",
             "The model has no layers named like the projections the group aligns (qkv: q/k/v_proj, query/key/value, "
             "Wq/Wk/Wv; gate_up: gate_proj/up_proj, w1/w3), and none fused already, so the group constrains nothing.",
             "model \"builtin:tiny-cnn\"\ngroup auto qkv"),
    CodeInfo("Q246", "mixed precision has nothing to search (warning)",
             "Only layers whose winning rule gives one of the choices are searched; when no rule does, every "
             "layer keeps its rule's scheme and the search does nothing.",
             "quantize { \"*\" -> W8A8 }\nmixed_precision { choices [w4, w8] budget 5 bits }"),
    CodeInfo("Q239", "report path qrc cannot write",
             "`--report` writes HTML (a path ending in .html) or Markdown (.md); another extension or a folder "
             "is refused before any work, so a long compile never ends without its report.",
             "qrc compile r.recipe --report out/report.pdf"),
    CodeInfo("Q240", "scheme never used (warning)",
             "A scheme no rule or choice names has no effect; often a rule names the wrong scheme.",
             "scheme w8 { weights int8 }   # and no rule -> w8"),
    CodeInfo("Q241", "no quantize rules (warning)",
             "Without rules every layer stays in float and the compile produces a copy of the model.",
             "recipe r { model \"builtin:tiny-llama\" }"),
    CodeInfo("Q242", "chunk larger than the sample count (warning)",
             "A chunk is a number of samples per forward pass; it is clamped to the sample count.",
             "calibrate { data synthetic { samples 8 } chunk 16 }"),
    CodeInfo("Q243", "bit budget allows the widest choice everywhere (warning)",
             "With a budget at or above every searched layer at its widest choice (storage bits, scales "
             "included) the search has nothing to trade and assigns the widest scheme everywhere.",
             "mixed_precision { choices [w4, w8] budget 9 bits }"),
)
