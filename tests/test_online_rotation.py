"""`transform quarot { online r4 }` (issue 67): each down projection's input rotated by a random Hadamard as the
model runs, its inverse folded into the weight. The float model computes the same before any quantization; the
folder names the rotation in `quantization_config.transform_config` and stores its matrix, in the form
llm-compressor's SpinQuantModifier writes and vLLM applies; compressed-tensors' own transform code, run on the
folder transformers loads, computes what qrc's verify measured, and transformers alone (which skips the
transform_config) does not, which is why the runtime table and `emit { runtime transformers }` refuse it."""

from __future__ import annotations

import json

import pytest
from test_rotations import _model, _tied_folder


@pytest.mark.parametrize("block", [None, 16], ids=["whole-width", "block-16"])
def test_the_online_rotation_leaves_the_float_model_unchanged(block):
    """R1 + R2 + R4 read tensor by tensor, with the online hooks on the down projections: the same logits (1e-4);
    without the hooks they differ, so the hook and the folded weight are each half of it. Block-diagonal (`block
    16`) too."""
    import copy

    import torch

    from compiler.backends.torch.rotation import Rotation, attach_online

    model = _model("Llama")
    checkpoint = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
    config = copy.deepcopy(model.config)
    config.tie_word_embeddings = False
    rotated = type(model)(config).eval()
    rotation = Rotation.seeded(config.hidden_size, config.hidden_size // config.num_attention_heads, seed=5,
                               down=config.intermediate_size, block=block)
    state = {}
    for key in rotated.state_dict():
        value = rotation.tensor(key, checkpoint.__getitem__, checkpoint)
        state[key] = value if value is not None else checkpoint[key]
    rotated.load_state_dict(state, strict=True)
    with torch.no_grad():
        unhooked = rotated(ids).logits
        assert attach_online(rotated, rotation.down) == config.num_hidden_layers
        after = rotated(ids).logits
    assert (after - before).abs().max().item() < 1e-4
    assert (unhooked - before).abs().max().item() > 1e-2
    stored = rotation.down.stored()
    assert set(stored.unique().tolist()) == {-1.0, 1.0}  # ±1: the runtime divides by √n
    n = block or config.intermediate_size
    assert stored.shape == (n, n)
    assert torch.allclose(stored @ stored.T, n * torch.eye(n), atol=1e-3)


RECIPE = """recipe online {{
    model "{model}"
    backend torch
    transform {kind} {{ {settings}online {online}{block} }}
    quantize {{ type Linear -> W8A8  "lm_head" -> none }}
    {data}
    emit "{out}"{target}
}}
"""


DATA = ("calibrate {{ data synthetic {{ samples 8  seqlen 64 }} }}\n"
        "    verify {{ samples 4  metric cosine  at_least 0.999 }}").format()


def _recipe(tmp_path, model, online="r4", target="", block="", data=DATA, kind="quarot", settings=""):
    recipe = tmp_path / "r.recipe"
    recipe.write_text(RECIPE.format(model=model, online=online, out=tmp_path / "out", target=target, block=block,
                                    data=data, kind=kind, settings=settings))
    return recipe


@pytest.mark.slow
@pytest.mark.parametrize(("block", "data", "kind"), [("", DATA, "quarot"), ("  block 16", DATA, "quarot"),
                                                     ("", "", "quarot"), ("", DATA, "smoothquant"),
                                                     ("", DATA + "\n    memory { mode offload }", "smoothquant")],
                         ids=["whole-width", "block-16", "file-to-file", "after-smoothquant", "after-smoothquant-offload"])
def test_an_online_rotated_folder_computes_in_compressed_tensors_what_verify_measured(tmp_path, block, data, kind):
    """The folder: its transform_config parses as compressed-tensors' TransformConfig, one ±1 matrix under the
    first down projection (its block's order where block-diagonal, which the config names `head_dim`);
    transformers' load plus compressed-tensors' apply_transform_config with that matrix computes the float model
    (cosine > 0.999, as verify passed at_least 0.999 on qrc's own load of it), and transformers' load alone is far
    off. Without data or verify nothing runs the model and the weights round file to file (the SmolLM2 example).
    After SmoothQuant (`transform smoothquant { alpha 0.7  online r4 }`) R4 is the only rotation: the smoothing
    folds, then each down projection turns, and the head stays tied to the embeddings; block by block (offload)
    each block's down projection turns once its own mappings have folded."""
    import torch
    import transformers
    from compiling import compile_
    from compressed_tensors.transform import TransformConfig, apply_transform_config
    from safetensors import safe_open

    folder = _tied_folder(tmp_path / "float")
    out = tmp_path / "out"
    settings = "alpha 0.7  " if kind == "smoothquant" else ""
    done = compile_(str(_recipe(tmp_path, folder, block=block, data=data, kind=kind, settings=settings)), out)
    assert done.exit_code == 0, done.output
    said = " ".join(done.output.replace("│", " ").split())  # the summary table's cells, unwrapped
    if data:
        assert "passed" in said and "online R4 applied by compressed-tensors" in said, done.output
    else:
        assert "no calibration pass" in said, done.output
    config = json.loads((out / "config.json").read_text())
    transforms = TransformConfig.model_validate(config["quantization_config"]["transform_config"])
    assert list(transforms.config_groups) == ["R4"]
    assert transforms.config_groups["R4"].head_dim == (16 if block else None)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        matrices = [k for k in f.keys() if k.endswith("R4_input.weight")]
        assert matrices == ["model.layers.0.mlp.down_proj.R4_input.weight"]
        stored = f.get_tensor(matrices[0])
    assert stored.shape == ((16, 16) if block else (256, 256))
    if kind == "smoothquant":
        assert "turned online by a random Hadamard" in said and config.get("tie_word_embeddings", True), done.output
    ids = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(2))

    def cosine(a, b):
        return torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()

    with torch.no_grad():
        before = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()(ids).logits.float()
        loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        alone = loaded(ids).logits.float()
        apply_transform_config(loaded, transforms)
        for name, module in loaded.named_modules():
            if name.endswith("R4_input"):
                module.weight.copy_(stored.to(module.weight.dtype))
        applied = loaded(ids).logits.float()
    assert cosine(before, applied) > 0.999
    assert cosine(before, alone) < 0.99


def test_online_r4_is_refused_for_transformers_and_r3_is_said(tmp_path):
    """`emit { runtime transformers }` with an online rotation: the runtime table's `no`, before any work; `online
    r3`: Q259 with the reason."""
    from compiling import app, runner

    def check(recipe):
        return runner.invoke(app, ["check", recipe])

    folder = _tied_folder(tmp_path / "float")
    done = check(str(_recipe(tmp_path, folder, target=" { runtime transformers  device cpu }")))
    assert done.exit_code == 2 and "transform_config" in done.output, done.output
    done = check(str(_recipe(tmp_path, folder, target=" { runtime vllm  device cpu }")))
    assert done.exit_code == 2 and "cpu_linear" in done.output, done.output
    done = check(str(_recipe(tmp_path, folder, online="r3")))
    assert done.exit_code == 2 and "Q259" in done.output and "R3" in done.output, done.output
    done = check(str(_recipe(tmp_path, folder, block="  block 24")))  # 24 divides neither 128 nor 256
    assert done.exit_code == 2 and "Q273" in done.output and "does not divide" in done.output, done.output
