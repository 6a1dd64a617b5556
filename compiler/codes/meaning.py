"""Diagnostic codes, Q2xx: what the recipe means against the model (names, schemes, patterns, groups, data)."""

from __future__ import annotations

from compiler.codes.info import CodeInfo

MEANING: tuple[CodeInfo, ...] = (
    CodeInfo("Q201", "pattern matches no layer",
             "A selector (or a group pattern) that matches nothing would silently leave the layers you meant "
             "unquantized. The help lists the model's closest layer names; `qrc inspect MODEL` lists them all.",
             'quantize { "*.mlp.gate" -> w4 }   # the layers are named *.mlp.gate_proj'),
    CodeInfo("Q202", "rule never wins (warning)",
             "Rules apply in order and the last match wins; a rule whose every layer is taken by later rules has "
             "no effect, which usually means the rules are in the wrong order.",
             'quantize { "*.self_attn.*" -> w8  "*" -> w4 }   # "*" comes last and takes everything'),
    CodeInfo("Q203", "undefined scheme",
             "A rule or a mixed-precision choice names a scheme that is neither defined in the recipe, a preset "
             "(W4A16, W8A16, W8A8) nor `none`. Without this check the layers would silently stay in float.",
             'quantize { "*" -> w4 }   # no `scheme w4 { … }`'),
    CodeInfo("Q204", "duplicate scheme name",
             "Two schemes with one name (or a scheme named like a preset or `none`) make every rule that uses "
             "the name ambiguous.",
             "scheme w4 { weights int4 group 128 }\nscheme w4 { weights int4 group 64 }"),
    CodeInfo("Q205", "unknown preset or base scheme",
             "`scheme NAME = BASE { … }` refines BASE, which must be a preset (W4A16, W8A16, W8A8) or a scheme "
             "defined earlier in the file.",
             "scheme w4 = W4A8 { group 64 }"),
    CodeInfo("Q206", "scheme quantizes no weights",
             "Every scheme quantizes weights (activation-only quantization has no runtime kernels). Add a "
             "`weights` line or refine a preset.",
             "scheme a8 { activations int8 }"),
    CodeInfo("Q207", "option does not apply to weights or activations",
             "Weights take per_tensor, per_channel or group N; activations take per_tensor or per_token and "
             "static/dynamic. A misplaced option would otherwise be ignored.",
             "scheme s { weights int8 per_token }"),
    CodeInfo("Q208", "block size MatMulNBits cannot take",
             "onnxruntime's MatMulNBits kernel needs weight-only schemes with `group N`, N a power of two ≥ 16. "
             "Other sizes fail when the emitted model is loaded, after the whole compile.",
             'scheme w4 { weights int4 group 100 }\nemit "m.onnx" { format matmul_nbits }'),
    CodeInfo("Q209", "percentile outside (0, 100]",
             "Percentile calibration clips activations at the given percentile of |x|; values outside (0, 100] "
             "have no meaning.",
             "method percentile 999"),
    CodeInfo("Q210", "group instance would end with mixed schemes (policy error)",
             "Fused attention kernels and exporters need Q, K and V of one block at one precision. With "
             "`policy error` a mixed instance is an error instead of being promoted.",
             'quantize { "*" -> w4  "*.v_proj" -> w8 }\ngroup "*.self_attn.{q,k,v}_proj" policy error'),
    CodeInfo("Q211", "group members promoted to one scheme (warning)",
             "With `policy promote` (the default) every member of a mixed instance takes the widest member's "
             "scheme (more bits, then weight-only, then finer granularity); the warning lists what moved.",
             'quantize { "*" -> w4  "*.v_proj" -> w8 }\ngroup "*.self_attn.{q,k,v}_proj"'),
    CodeInfo("Q212", "group pattern without exactly one `{…}`",
             "A group is written as one glob whose members differ only inside a single `{a,b,…}` alternation; "
             "that is how qrc forms one group instance per block.",
             'group "*.self_attn.q_proj"   # write: "*.self_attn.{q,k,v}_proj"'),
    CodeInfo("Q213", "invalid regular expression",
             "`re\"…\"` selectors use Python regex syntax and must fully match a layer name.",
             'quantize { re"layers.(0|1" -> w4 }'),
    CodeInfo("Q214", "invalid glob pattern",
             "Globs know `*`, `?` and one level of `{a,b}`; an unbalanced or nested brace cannot match as meant.",
             'quantize { "*.{q,k" -> w4 }'),
    CodeInfo("Q215", "setting given twice",
             "A setting, block or spec item given twice would make one of them silently win; qrc asks you to "
             "keep one.",
             "calibrate { chunk 8  chunk 16 }"),
    CodeInfo("Q216", "required setting missing",
             "Some settings have no sensible default: the model, a mixed-precision budget and choices, the "
             "tokenizer of text data, a path.",
             "recipe r { quantize { \"*\" -> W8A16 } }   # no model"),
    CodeInfo("Q217", "count is not a positive whole number",
             "Counts (chunk, samples, seqlen, workers, bins, group sizes) are whole numbers; fractions or zero "
             "cannot be executed.",
             "calibrate { chunk 0 }"),
    CodeInfo("Q218", "verify bound outside the metric's range",
             "cosine lies in [-1, 1], top1 in [0, 1], kld ≥ 0; an unreachable bound would fail (or pass) every "
             "compile.",
             "verify { metric cosine at_least 1.5 }"),
    CodeInfo("Q219", "verify bound in the wrong direction",
             "For cosine, sqnr and top1 higher is better (`at_least`); for kld lower is better (`at_most`).",
             "verify { metric kld at_least 0.1 }"),
    CodeInfo("Q220", "emit format not available on the backend",
             "The ONNX backend emits `qdq` or `matmul_nbits`; the torch backend emits `safetensors`.",
             'backend torch\nemit "m.onnx" { format qdq }'),
    CodeInfo("Q221", "`mode multi_gpu` without `vram`",
             "Placing layers on several GPUs needs the memory each device may use.",
             "memory { mode multi_gpu }   # add: vram 2 x 80 GiB"),
    CodeInfo("Q222", "option does not apply to this data source",
             "synthetic data takes samples/seqlen/seed, npz takes samples (shapes come from the file), text "
             "takes samples/seqlen/tokenizer.",
             'data npz "calib.npz" { seqlen 128 }'),
    CodeInfo("Q223", "mixed-precision choices unusable",
             "The search needs at least two different quantized schemes to choose between; `none` is not a "
             "choice (keep layers float with a `-> none` rule).",
             "mixed_precision { choices [w4] budget 4 bits }"),
    CodeInfo("Q224", "bit budget below the narrowest choice",
             "The average weight bits cannot go below the narrowest scheme in `choices`, so no assignment can "
             "meet the budget.",
             "mixed_precision { choices [w4, w8] budget 3 bits }"),
    CodeInfo("Q225", "4-bit integer activations",
             "No runtime has kernels for 4-bit integer activations; activations are int8, uint8 or fp8, or the 4-bit "
             "floating formats with their own block scales (`nvfp4`, `mxfp4`: the NVFP4 and MXFP4 presets).",
             "scheme s { weights int4 group 128  activations int4 }"),
    CodeInfo("Q226", "gptq rounding on a layer that is not a MatMul or Gemm",
             "GPTQ rounds a weight against the Hessian of the activations it multiplies; an embedding (Gather) "
             "multiplies nothing and a Conv's input is not a row of features, so on the ONNX backend GPTQ takes "
             "MatMul and Gemm weights only.",
             'quantize { "*" -> w4gptq }   # with backend onnx: the embedding (Gather) is matched too'),
    CodeInfo("Q227", "op cannot pass calibration ranges through",
             "`passthrough` lists distribution-preserving ops whose outputs inherit their input's range; other "
             "ops change the distribution and must be observed.",
             "passthrough [Softmax]"),
    CodeInfo("Q228", "unknown layer type",
             "`type X` selects layers by kind: Linear, MatMul, Gemm, Conv or Embedding.",
             "quantize { type Dense -> w8 }"),
    CodeInfo("Q229", "bit budget below the cheapest assignment",
             "The budget counts storage bits per weight over the searched layers, scales and zero points "
             "included (int4 in groups of 128 with float32 scales is 4.25 bits). A budget below every searched "
             "layer at its cheapest choice cannot be met.",
             "mixed_precision { choices [w4, w8] budget 4.1 bits }   # w4 = W4A16, group 128"),
    CodeInfo("Q230", "unknown `--set` key",
             "`--set` replaces one setting of the recipe; the key names the block and the setting.",
             "qrc check r.recipe --set memory.rma=2GiB"),
    CodeInfo("Q231", "`--set` without `key=value`",
             "Each `--set` takes one `key=value` pair.",
             "qrc check r.recipe --set memory.ram"),
    CodeInfo("Q232", "zero or negative memory budget",
             "A budget of zero cannot fit anything; leave the setting out to have qrc detect free memory.",
             "memory { ram 0 GiB }"),
    CodeInfo("Q234", "`mode multi_gpu` on the ONNX backend",
             "Multi-GPU placement is done by the torch backend; ONNX runs on one device.",
             "backend onnx\nmemory { mode multi_gpu vram 2 x 80 GiB }"),
)
