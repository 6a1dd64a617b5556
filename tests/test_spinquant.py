"""SpinQuant's learned rotations (`transform spinquant`, issue 67): Cayley SGD keeps R1 and every R2 orthogonal, the
learned rotation folded into the weights leaves the float model's logits as they were (to 1e-4), the learning lowers
the quantized model's loss it is trained on, and a compile plans the learning op and writes a folder transformers
loads that computes the float model's outputs."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "recipes" / "data" / "tokenizer" / "tokenizer.json"
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def _model(family: str = "Llama", hidden: int = 64):
    import torch
    import transformers

    config = getattr(transformers, f"{family}Config")(
        vocab_size=512, hidden_size=hidden, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=256, initializer_range=0.2)
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config).eval()
    with torch.no_grad():  # norms far from ones, one outlier channel, biases far from zero: what folding carries
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
                p[..., 3] = 8.0
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    return model


def _feeds(samples: int = 8, tokens: int = 32) -> list[dict]:
    ids = np.random.default_rng(0).integers(0, 512, (samples, tokens))
    return [{"input_ids": ids[k:k + 4], "attention_mask": np.ones((min(4, samples - k), tokens), np.int64)}
            for k in range(0, samples, 4)]


def _learned(model, scheme: str = "NVFP4", iters: int = 12, online: bool = False, identity: bool = False,
             rate: float = 1.5, block: int | None = None):
    from compiler.backends.torch.rotation import Rotation
    from compiler.backends.torch.spinquant import learn_rotation
    from compiler.ir.schemes import PRESETS

    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    schemes = {f"model.layers.{n}.{part}": PRESETS[scheme] for n in range(config.num_hidden_layers) for part in LINEARS}
    start = Rotation.seeded(config.hidden_size, head_dim, down=config.intermediate_size if online else None,
                            block=block)
    return learn_rotation(copy.deepcopy(model), start, schemes, _feeds(), iters, rate, 2, identity=identity)


@pytest.mark.parametrize(("family", "hidden", "online", "identity", "block"),
                         [("Llama", 64, False, False, None), ("Qwen2", 48, False, False, None),
                          ("Llama", 64, True, False, None), ("Llama", 64, False, True, None),
                          ("Llama", 64, True, False, 16)],
                         ids=["llama-tied", "qwen2-biases-paley", "llama-online-r4", "llama-from-identity",
                              "llama-blocks-of-16"])
def test_the_learned_rotation_is_orthogonal_and_folds_to_the_same_float_logits(family, hidden, online, identity, block):
    import torch

    from compiler.backends.torch.rotation import Rotation, attach_online

    model = _model(family, hidden)
    learned = _learned(model, online=online, identity=identity, block=block)
    rotation = learned.rotation
    q = rotation.q.matrix
    assert not torch.allclose(q, torch.eye(q.shape[0]), atol=1e-3)  # the steps moved it
    assert (q @ q.T - torch.eye(q.shape[0])).abs().max().item() < 1e-5
    if block:  # each block turned within itself: nothing between blocks, and each block moved from its start
        outside = (torch.arange(hidden)[:, None] // block) != (torch.arange(hidden)[None, :] // block)
        assert q[outside].abs().max().item() < 1e-6 and rotation.block == block
        start = Rotation.seeded(hidden, None, block=block).q.right(torch.eye(hidden))
        assert all(not torch.allclose(q[k:k + block, k:k + block], start[k:k + block, k:k + block], atol=1e-4)
                   for k in range(0, hidden, block))
    assert rotation.layer_heads is not None and len(rotation.layer_heads) == 2
    for h in rotation.layer_heads:
        assert (h @ h.T - torch.eye(h.shape[0])).abs().max().item() < 1e-5
    checkpoint = {k: v.detach().clone() for k, v in model.state_dict().items()}
    checkpoint.setdefault("lm_head.weight", checkpoint["model.embed_tokens.weight"])
    rotated = copy.deepcopy(model)
    rotated.lm_head.weight = torch.nn.Parameter(rotated.lm_head.weight.detach().clone())
    state = {}
    for key in rotated.state_dict():
        turned = rotation.tensor(key, checkpoint.__getitem__, checkpoint)
        state[key] = turned if turned is not None else checkpoint[key]
    rotated.load_state_dict(state, strict=True)
    if online:
        attach_online(rotated, rotation.down)
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before, after = model(ids).logits, rotated(ids).logits
    assert (after - before).abs().max().item() < 1e-4 * max(1.0, before.abs().max().item())


@pytest.mark.parametrize("identity", [False, True], ids=["from-hadamard", "from-identity"])
def test_learning_lowers_the_quantized_loss_on_samples_the_steps_never_ran(identity):
    """One calibration sample in eight is held out of the steps; the rotation kept gives a lower loss on it than
    the start's, W4A4 NVFP4 (whose 4-bit inputs the rotation is for)."""
    learned = _learned(_model(), iters=20, identity=identity)
    assert learned.steps == 20 and learned.seconds > 0 and learned.held_out == 1
    assert np.isfinite(learned.first_loss) and learned.kept_loss < learned.first_loss, learned
    assert 0 < learned.kept_step <= 20
    assert learned.started == ("no rotation" if identity else "QuaRot's rotation")


def test_the_start_is_a_candidate_of_the_rotation_kept():
    """Before any step the rotation kept is the start's, measured on the held-out sample (QuaRot's Hadamard)."""
    import torch

    from compiler.backends.torch.rotation import Rotation

    learned = _learned(_model(), iters=0)
    assert learned.kept_step == 0 and learned.kept_loss == learned.first_loss
    expected = Rotation.seeded(64, 16).q.right(torch.eye(64))
    assert torch.equal(learned.rotation.q.matrix, expected)


def _folder(path: Path) -> Path:
    _model().save_pretrained(path)
    return path


RECIPE = """recipe learned {{
    model "{model}"
    backend torch
    transform spinquant {{ iters 6  batch 2 }}
    quantize {{ type Linear -> {scheme}  "lm_head" -> none }}
    calibrate {{ data text "{text}" {{ samples 8  seqlen 32  tokenizer "{tokenizer}" }} }}
    verify {{ samples 2  metric cosine  at_least 0.9 }}
    emit "{out}"
}}
"""


def _recipe(tmp_path: Path, scheme: str = "W8A8") -> tuple[Path, Path, Path]:
    folder, out = _folder(tmp_path / "float"), tmp_path / "out"
    text = tmp_path / "calib.txt"
    text.write_text("".join(f"line {i} of the calibration text, with words to tokenize and learn from\n"
                            for i in range(40)))
    recipe = tmp_path / "r.recipe"
    recipe.write_text(RECIPE.format(model=folder, scheme=scheme, text=text, tokenizer=TOKENIZER, out=out))
    return recipe, folder, out


def test_the_plan_learns_before_it_loads(tmp_path):
    from compiler import plan_file
    from compiler.plan import ops

    recipe, _, _ = _recipe(tmp_path)
    result = plan_file(recipe)
    assert result.ok and result.plan is not None, result.diagnostics
    kinds = [op.kind for op in result.plan.ops]
    assert kinds[:2] == [ops.OpKind.LEARN_ROTATION, ops.OpKind.LOAD_MODEL]
    learn, load = result.plan.ops[0], result.plan.ops[1]
    assert isinstance(learn, ops.LearnRotation) and (learn.iters, learn.batch, learn.lr) == (6, 2, 1.5)
    assert learn.peak_bytes > load.peak_bytes and learn.seconds > 0
    assert ops.Buffer.ROTATION in learn.outputs and ops.Buffer.ROTATION in load.inputs
    assert "learned rotation" in load.summary


@pytest.mark.slow
def test_a_learned_rotation_compiles_loads_and_computes_the_float_model(tmp_path):
    """Through `qrc compile`: the summary says what the learning bought, and the folder transformers loads (its head
    untied) computes what the unrotated float model computes, measured outside qrc."""
    from compiling import compile_, folders_agree

    recipe, folder, out = _recipe(tmp_path)
    done = compile_(str(recipe), out)
    assert done.exit_code == 0, done.output
    text = " ".join(re.sub("[│┃]", " ", done.output).split())  # the summary table's cells, unwrapped
    found = re.search(r"learned in 6 Cayley SGD steps \([\d.]+ s\): the quantized model's next-token loss on 1 "
                      r"held-out calibration sample\(s\) ([\d.]+) with QuaRot's rotation, ([\d.]+) with the rotation "
                      r"kept \(after step (\d)\)", text)
    assert found is not None, text
    assert float(found[2]) <= float(found[1])  # the start is a candidate: the kept one is never worse on them
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    cosine, _ = folders_agree(folder, out)
    assert cosine > 0.99, cosine
