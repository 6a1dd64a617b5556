"""GPTQ onto FP4 (`rounding gptq` with NVFP4 or MXFP4 weights): with `minmax_scales` the folder keeps the block
scales (and NVFP4's global scale) round to nearest writes and moves the e2m1 codes; by default the block scales are
the ones searched with the Hessian's diagonal (NVFP4's global scale still round to nearest's); either way its
outputs come closer to the float model's, and transformers loads and runs it."""

from __future__ import annotations

import pytest
import torch
from compiling import compile_program

pytest.importorskip("compressed_tensors")

RECIPE = """recipe fp4_{name} {{
    model "{model}"
    backend torch
    scheme s = {scheme} {{ rounding {rounding} }}
    quantize {{ type Linear -> s  "lm_head" -> none }}
    calibrate {{ data synthetic {{ samples 32  seqlen 128 }}  chunk 4 }}
    verify {{ samples 4  metric cosine  at_least 0.9 }}
    emit "{out}"
}}
"""


def _llama(folder):
    """A small Llama built from its transformers config (random weights), saved as a folder transformers loads."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(folder))
    return folder


def _compiled(tmp_path, scheme: str, rounding: str):
    name = rounding.replace(" ", "_")
    out = tmp_path / name
    recipe = tmp_path / f"{name}.recipe"
    model = tmp_path / "llama" if (tmp_path / "llama").exists() else _llama(tmp_path / "llama")
    recipe.write_text(RECIPE.format(scheme=scheme, rounding=rounding, name=name, out=out, model=model))
    result, _ = compile_program(str(recipe), out)
    return result, out


def _tensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    loaded = load_file(str(folder / "model.safetensors"))
    return {k: v.view(torch.uint8) if v.element_size() == 1 else v for k, v in loaded.items()}


@pytest.mark.slow  # a compile each: kept out of the quick loop's three minutes
@pytest.mark.parametrize("scheme", ["NVFP4A16", "MXFP4A16", "NVFP4"])
def test_gptq_keeps_the_block_scales_moves_the_codes_and_lowers_the_error(scheme, tmp_path):
    rtn, rtn_out = _compiled(tmp_path, scheme, "rtn")
    ranges, ranges_out = _compiled(tmp_path, scheme, "gptq minmax_scales")
    gptq, gptq_out = _compiled(tmp_path, scheme, "gptq")
    for result in (ranges, gptq):
        assert result.verify["kld"] < 0.95 * rtn.verify["kld"], (result.verify, rtn.verify)
    a, b, c = _tensors(rtn_out), _tensors(ranges_out), _tensors(gptq_out)
    assert a.keys() == b.keys() == c.keys()
    scales = [k for k in a if k.endswith(("weight_scale", "weight_global_scale"))]
    packed = [k for k in a if k.endswith("weight_packed")]
    assert len(packed) == 14 and len(scales) >= 14
    assert all(torch.equal(a[k], b[k]) for k in scales), [k for k in scales if not torch.equal(a[k], b[k])]
    assert all(not torch.equal(a[k], b[k]) for k in packed)
    searched = [k for k in scales if not torch.equal(a[k], c[k])]
    assert searched and all(k.endswith("weight_scale") for k in searched), searched  # global scales unchanged

    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(gptq_out))
    with torch.no_grad():
        logits = model(torch.arange(16)[None]).logits
    assert torch.isfinite(logits).all()
