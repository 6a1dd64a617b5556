"""Tiny random-weight models of the families people quantize, built from transformers configs (no
download): what the model-zoo tests compile. Each is saved once per test session with save_pretrained."""

from __future__ import annotations

from pathlib import Path

SIZES = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)
# the hold-out MoE families: experts of 32 (`intermediate_size` or `moe_intermediate_size`, each family reads one)
MOE_SIZES = dict(SIZES, intermediate_size=32, moe_intermediate_size=32, num_experts_per_tok=2, bos_token_id=0,
                 eos_token_id=1)


def configs(t) -> dict:
    """family → (config, model class): dense decoders (tied and untied), GPT-2, MoE and MLA decoders, VLMs."""
    head = dict(head_dim=16)
    # Gemma 4: a sliding and a full attention layer (the full one with a head size of its own and proportional
    # RoPE), per-layer input embeddings
    gemma4 = dict(**SIZES, head_dim=16, layer_types=["sliding_attention", "full_attention"],
                  per_layer_config={"01": {"head_dim": 32}}, hidden_size_per_layer_input=32, vocab_size_per_layer_input=320,
                  sliding_window=16)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=8)
    return {
        "llama": (t.LlamaConfig(**SIZES, tie_word_embeddings=False), t.LlamaForCausalLM),
        "llama-tied": (t.LlamaConfig(**SIZES, tie_word_embeddings=True), t.LlamaForCausalLM),
        "qwen2": (t.Qwen2Config(**SIZES, tie_word_embeddings=False), t.Qwen2ForCausalLM),
        "qwen3": (t.Qwen3Config(**SIZES, **head, tie_word_embeddings=False), t.Qwen3ForCausalLM),
        "qwen3-tied": (t.Qwen3Config(**SIZES, **head, tie_word_embeddings=True), t.Qwen3ForCausalLM),
        "mistral": (t.MistralConfig(**SIZES, **head), t.MistralForCausalLM),
        "granite": (t.GraniteConfig(**SIZES), t.GraniteForCausalLM),
        "olmo2": (t.Olmo2Config(**SIZES), t.Olmo2ForCausalLM),
        "gemma2": (t.Gemma2Config(**SIZES, **head), t.Gemma2ForCausalLM),
        "gemma3_text": (t.Gemma3TextConfig(**SIZES, **head), t.Gemma3ForCausalLM),
        "phi3": (t.Phi3Config(**SIZES, pad_token_id=0), t.Phi3ForCausalLM),
        "gpt2": (t.GPT2Config(vocab_size=320, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                              bos_token_id=0, eos_token_id=0), t.GPT2LMHeadModel),
        "opt": (t.OPTConfig(vocab_size=320, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                            max_position_embeddings=128, word_embed_proj_dim=64), t.OPTForCausalLM),
        "bert": (t.BertConfig(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=128, max_position_embeddings=128), t.BertModel),
        "mixtral": (t.MixtralConfig(**SIZES, num_local_experts=4, num_experts_per_tok=2), t.MixtralForCausalLM),
        "qwen3_moe": (t.Qwen3MoeConfig(**SIZES, **head, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
                      t.Qwen3MoeForCausalLM),
        "deepseek_v3": (t.DeepseekV3Config(vocab_size=320, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                           n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                           first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                                           qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_group=2,
                                           topk_group=1, max_position_embeddings=128), t.DeepseekV3ForCausalLM),
        # MoE families the tests above were not written for (issue 68's hold-out shelf): per-expert checkpoints that
        # transformers 5 fuses at load, with routers of their own kinds (ERNIE's counts its experts in
        # `moe_num_experts`), and fused-on-disk ones (GraniteMoE's `input_linear`, gpt-oss's, Llama 4's)
        **{name: (config_class(**{**MOE_SIZES, **extra}), model_class) for name, config_class, model_class, extra in (
            ("ernie4_5_moe", t.Ernie4_5_MoeConfig, t.Ernie4_5_MoeForCausalLM,
             dict(intermediate_size=128, moe_num_experts=4, moe_k=2, moe_layer_start_index=1)),
            ("olmoe", t.OlmoeConfig, t.OlmoeForCausalLM, dict(num_experts=4, pad_token_id=0)),
            ("phimoe", t.PhimoeConfig, t.PhimoeForCausalLM, dict(num_local_experts=4)),
            ("qwen2_moe", t.Qwen2MoeConfig, t.Qwen2MoeForCausalLM,
             dict(intermediate_size=128, shared_expert_intermediate_size=32, num_experts=4)),
            ("glm4_moe", t.Glm4MoeConfig, t.Glm4MoeForCausalLM,
             dict(intermediate_size=128, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, head_dim=16,
                  n_group=1, topk_group=1)),
            ("hunyuan_v1_moe", t.HunYuanMoEV1Config, t.HunYuanMoEV1ForCausalLM, dict(num_experts=4, moe_topk=2, head_dim=16)),
            ("dots1", t.Dots1Config, t.Dots1ForCausalLM,
             dict(intermediate_size=128, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, head_dim=16)),
            ("minimax", t.MiniMaxConfig, t.MiniMaxForCausalLM,
             dict(num_local_experts=4, head_dim=16, layer_types=["full_attention", "full_attention"])),
            ("granitemoe", t.GraniteMoeConfig, t.GraniteMoeForCausalLM, dict(num_local_experts=4)),
            ("gpt_oss", t.GptOssConfig, t.GptOssForCausalLM,
             dict(num_local_experts=4, head_dim=16, layer_types=["sliding_attention", "full_attention"], sliding_window=16)),
            # experts of 64: whole NVFP4 super-blocks of GGUF (rows of 64) in every expert projection
            ("gpt_oss_64", t.GptOssConfig, t.GptOssForCausalLM,
             dict(num_local_experts=4, head_dim=16, layer_types=["sliding_attention", "full_attention"], sliding_window=16,
                  intermediate_size=64)),
            ("llama4_text", t.Llama4TextConfig, t.Llama4ForCausalLM,
             dict(intermediate_size_mlp=128, num_local_experts=4, num_experts_per_tok=1, head_dim=16,
                  interleave_moe_layer_step=1)))},
        "gemma4_text": (t.Gemma4TextConfig(**gemma4), t.Gemma4ForCausalLM),
        # Gemma 4's MoE variant: its checkpoint stores the experts fused (3-D), routers `router.proj`
        "gemma4_moe": (t.Gemma4TextConfig(**gemma4, enable_moe_block=True, num_experts=4, top_k_experts=2,
                                          moe_intermediate_size=32), t.Gemma4ForCausalLM),
        # VLMs: a vision tower and projector in front of a language model; ids ≥ 300 stand for images
        "llava": (t.LlavaConfig(text_config=t.LlamaConfig(**SIZES).to_dict(), image_token_index=300,
                                vision_config=t.CLIPVisionConfig(**vision).to_dict()), t.LlavaForConditionalGeneration),
        "qwen2_vl": (t.Qwen2VLConfig(text_config=dict(**SIZES, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
                                     vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, patch_size=4,
                                                        spatial_merge_size=2, temporal_patch_size=2),
                                     image_token_id=300, video_token_id=301, vision_start_token_id=302),
                     t.Qwen2VLForConditionalGeneration),
        "qwen2_5_vl": (t.Qwen2_5_VLConfig(
            text_config=dict(**SIZES, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                               spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64, fullatt_block_indexes=[0]),
            image_token_id=300, video_token_id=301, vision_start_token_id=302), t.Qwen2_5_VLForConditionalGeneration),
        "gemma3": (t.Gemma3Config(text_config=dict(**SIZES, **head), mm_tokens_per_image=4, image_token_index=300,
                                  vision_config=t.SiglipVisionConfig(**vision).to_dict()),
                   t.Gemma3ForConditionalGeneration),
        "gemma4": (t.Gemma4Config(text_config=gemma4, audio_config=None, image_token_id=300, boi_token_id=301,
                                  eoi_token_id=302,
                                  vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                     num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                                     patch_size=4, position_embedding_size=64)),
                   t.Gemma4ForConditionalGeneration),
    }


# the dense families the zoo test compiles end to end (and GPT-2, refused)
FAMILIES = ("llama", "llama-tied", "qwen2", "qwen3", "qwen3-tied", "mistral", "granite", "olmo2", "gemma2",
            "gemma3_text", "gemma4_text", "phi3", "opt", "gpt2")
MOE = ("mixtral", "qwen3_moe", "deepseek_v3")  # per-expert checkpoints, fused 3-D experts in transformers 5
FUSED_MOE = ("gemma4_moe",)  # experts fused in the checkpoint too: they stay float (Q266)
# MoE families no test above was written for: per-expert checkpoints (every expert quantized), and fused ones
HOLDOUT_MOE = ("ernie4_5_moe", "olmoe", "phimoe", "qwen2_moe", "glm4_moe", "hunyuan_v1_moe", "dots1", "minimax")
HOLDOUT_FUSED_MOE = ("granitemoe", "gpt_oss")  # stored fused: they stay float, said (Q266)
# stored fused, and transformers opens a compressed-tensors folder of it with one Linear per expert: written so
PER_EXPERT_FUSED_MOE = ("llama4_text",)
VLM = ("llava", "qwen2_vl", "qwen2_5_vl", "gemma3", "gemma4")


def build(family: str, folder: Path) -> Path:
    """Save the tiny `family` model (seeded random weights) to `folder` and return it."""
    import torch
    import transformers

    config, cls = configs(transformers)[family]
    torch.manual_seed(0)
    cls(config).eval().save_pretrained(folder)
    return folder


# e2m1's sixteen codes (the sign in the top bit), as an MXFP4 byte's nibbles index them
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def gpt_oss_mxfp4(folder: Path, family: str = "gpt_oss") -> Path:
    """The tiny gpt-oss as its releases store it: each expert projection MXFP4 (`_blocks`: uint8 [experts, out,
    in/32, 16], the low nibble the even column; `_scales`: E8M0 exponents + 127, [experts, out, in/32]), rounded
    from the random float weights by nearest code under a power-of-two scale per 32 inputs; the rest float, and
    config.json's `quantization_config` saying `mxfp4`. Saved to `folder`."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    build(family, folder)
    codes = torch.tensor(_E2M1)
    tensors = load_file(folder / "model.safetensors")
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        weight = tensors.pop(name).float().transpose(1, 2)  # transformers holds [experts, in, out]
        groups = weight.reshape(*weight.shape[:2], -1, 32)
        exponent = torch.floor(torch.log2(groups.abs().amax(-1, keepdim=True).clamp(min=2.0 ** -100))) - 2
        index = (groups / torch.exp2(exponent)).unsqueeze(-1).sub(codes).abs().argmin(-1)
        tensors[name + "_blocks"] = (index[..., 0::2] | (index[..., 1::2] << 4)).to(torch.uint8)
        tensors[name + "_scales"] = (exponent.squeeze(-1) + 127).to(torch.uint8)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def routed_moe(family: str, folder: Path) -> Path:
    """A Qwen3-MoE or Mixtral of 8 experts (top 2) with rows of whole groups of 32 and 64, routing weights
    renormalised over the chosen experts as llama.cpp's graphs compute them, with a tokenizer of its 320 ids."""
    import torch
    import transformers

    torch.manual_seed(0)
    sizes = dict(vocab_size=320, hidden_size=128, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False, num_experts_per_tok=2)
    if family == "qwen3_moe":
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            **sizes, head_dim=32, num_experts=8, moe_intermediate_size=64, norm_topk_prob=True))
    else:
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**sizes, num_local_experts=8))
    model.eval().save_pretrained(folder)
    return add_tokenizer(folder, 320)


def tokenized_llama(folder: Path, layers: int, hidden: int = 512) -> Path:
    """A random Llama of `layers` blocks (hidden 512, rows of 512 and 1536 weights: whole K-quant super-blocks;
    `hidden` another multiple of 256, the intermediate size 3 times it) with a tokenizer of its 320 ids, as a GGUF
    file needs, saved to `folder`."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=320, hidden_size=hidden, intermediate_size=3 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=hidden // 64,
                                      num_key_value_heads=hidden // 128, head_dim=64, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return add_tokenizer(folder, 320)


def build_all(root: Path, families) -> Path:
    """Each of `families` saved under `root/<family>`; returns `root`."""
    for family in families:
        build(family, root / family)
    return root


def transformers_cosines(float_folder: Path, out_folder: Path, auto, batches, dequantize: bool = True):
    """Per-sample cosine of the first output (logits, or hidden states) between the float folder and the
    emitted one, both loaded by transformers, on `batches`: the independent measurement qrc's own verify
    figure is checked against. `dequantize`: compressed-tensors dequantizes the weights at load and the model
    runs in float (activations not quantized); else transformers' default, compressed-tensors' forward
    (activations quantized as the scheme says). Returns the cosines and the loaded quantized model."""
    import torch
    import transformers

    reference = auto.from_pretrained(str(float_folder)).eval()
    config = {"quantization_config": transformers.CompressedTensorsConfig(dequantize=True)} if dequantize else {}
    quantized = auto.from_pretrained(str(out_folder), **config).eval()
    cosines = []
    with torch.no_grad():
        for feed in batches:
            feed = {k: torch.from_numpy(v) for k, v in feed.items()}
            for r, c in zip(reference(**feed)[0].float(), quantized(**feed)[0].float(), strict=True):
                cosines.append(float(torch.nn.functional.cosine_similarity(r.reshape(-1), c.reshape(-1), dim=0)))
    return cosines, quantized


# text a tiny byte-level BPE tokenizer learns its merges from (any English text would do)
_TOKENIZER_TEXT = ("The quick brown fox jumps over the lazy dog. A quantized model keeps most of what the float "
                   "model knows while it reads fewer bytes for every token it writes. Llamas and camels live in "
                   "the mountains; people quantize models to run them on their own machines. ") * 8


# GPT-4o's (o200k) pre-tokenizer split, as gpt-oss's tokenizer.json has it
O200K_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
               r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
               r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def add_tokenizer(folder: Path, vocab_size: int, eos: str = "<|endoftext|>", o200k: bool = False) -> Path:
    """A byte-level BPE tokenizer (GPT-2's pre-tokenizer; with `o200k`, GPT-4o's split as gpt-oss has it) of
    exactly `vocab_size` ids, trained on a fixed text and saved into `folder` as transformers saves one
    (tokenizer.json, tokenizer_config.json); the config's bos/eos ids point at its one special token. No
    download."""
    import json

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if o200k:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(O200K_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[eos],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([_TOKENIZER_TEXT], trainer)
    assert tokenizer.get_vocab_size() == vocab_size, tokenizer.get_vocab_size()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos, bos_token=eos).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(bos_token_id=tokenizer.token_to_id(eos), eos_token_id=tokenizer.token_to_id(eos))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def tiny_llava(root: Path, template: str, prompts: list[str]) -> Path:
    """A tiny LLaVA folder (`root/llava`) with its processor (CLIP image processor, 32×32 images in 16 image
    tokens, `template` as its chat template), and beside it a JSONL of 12 generated images with `prompts`
    (`images.jsonl`, `N.png`) and the same rows as an image folder (`folder/`, datasets' imagefolder)."""
    import json

    import numpy as np
    import torch
    import transformers as t
    from PIL import Image

    repo = Path(__file__).resolve().parents[1]
    tokenizer = t.PreTrainedTokenizerFast.from_pretrained(str(repo / "recipes" / "data" / "tokenizer"))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    text = t.LlamaConfig(vocab_size=520, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256)
    vision = t.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=32, patch_size=8)
    config = t.LlavaConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                           image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                           vision_feature_select_strategy="default", vision_feature_layer=-1)
    torch.manual_seed(0)
    t.LlavaForConditionalGeneration(config).eval().save_pretrained(root / "llava")
    t.LlavaProcessor(image_processor=t.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
                     tokenizer=tokenizer, patch_size=8, vision_feature_select_strategy="default", chat_template=template,
                     num_additional_image_tokens=1).save_pretrained(root / "llava")
    rng = np.random.RandomState(0)
    with (root / "images.jsonl").open("w") as rows:
        for i in range(12):
            y, x = np.mgrid[0:40, 0:48]
            pattern = np.stack([(x * (i + 1) * 5) % 256, (y * (i + 3) * 7) % 256, ((x + y) * 11) % 256], -1)
            Image.fromarray((pattern + rng.randint(0, 40, pattern.shape)).clip(0, 255).astype(np.uint8)).save(root / f"{i}.png")
            rows.write(json.dumps({"image": f"{i}.png", "prompt": prompts[i % len(prompts)]}) + "\n")
    folder = root / "folder"  # the same images as a folder with a metadata.jsonl (`datasets`' imagefolder)
    folder.mkdir()
    with (folder / "metadata.jsonl").open("w") as rows:
        for i in range(12):
            (folder / f"{i}.png").write_bytes((root / f"{i}.png").read_bytes())
            rows.write(json.dumps({"file_name": f"{i}.png", "prompt": prompts[i % len(prompts)]}) + "\n")
    return root


