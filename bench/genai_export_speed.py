"""Issue 69's genai question, measured: qrc compiles an HF decoder folder straight to int4 ONNX (its own export of
the folder, then MatMulNBits) — does it decode in onnxruntime-genai as fast as onnxruntime-genai's model builder's
own int4 of the same folder? Both from the same random-weight folder, in one run, decode speed interleaved.

    python bench/genai_export_speed.py [--layers 4 --hidden 512 --vocab 8192] [--rounds 3]

Rows: the builder's int4 (block 32, accuracy_level 4: its CPU default), qrc's int4 (rtn, block 32, accuracy_level 4)
of the folder. Decode: bench/onnx_decoder.py's `decode_ms` (greedy, 256 tokens after an 8-token prompt, median of
5 generations), in alternating rounds; each row's median over the rounds and the ratio to the builder's. The
export qrc ran is said (onnxruntime-genai's builder where it exports the family, else torch.onnx's dynamo)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_ort import run_qrc  # noqa: E402
from onnx_decoder import BLOCK, builder, decode_ms, decoder_folder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        folder = decoder_folder(tmp, args.layers, args.hidden, args.vocab, family="llama")
        theirs = tmp / "builder-int4"
        _, _, failed = builder(folder, theirs, "int4")
        assert not failed, failed
        ours = tmp / "qrc" / "model.onnx"
        recipe = tmp / "qrc.recipe"
        recipe.write_text(f'recipe genai_speed {{ model "{folder}"  backend onnx\n'
                          f"  scheme s = W4A16 {{ group {BLOCK} }}\n"
                          '  quantize { type Linear -> s  "model.embed_tokens" -> none }\n'
                          f'  emit "{ours}" {{ format matmul_nbits  accuracy_level 4 }} }}\n')
        seconds, _, failed = run_qrc(recipe)
        assert not failed, failed
        graph = json.loads((ours.parent / "genai_config.json").read_text())
        exporter = ("onnxruntime-genai's builder" if b"GroupQueryAttention" in ours.read_bytes()
                    else "torch.onnx's dynamo exporter")
        times: dict[str, list[float]] = {"builder int4": [], "qrc int4 (its own export)": []}
        for _ in range(args.rounds):
            times["builder int4"].append(decode_ms(theirs))
            times["qrc int4 (its own export)"].append(decode_ms(ours.parent))
        base = statistics.median(times["builder int4"])
        print(f"Llama {args.layers} layers, hidden {args.hidden}, vocab {args.vocab} (random weights); qrc exported "
              f"with {exporter} and compiled in {seconds:.1f} s; genai model type {graph['model']['type']}\n")
        print("| int4, block 32, accuracy_level 4 | decode ms/token (median) | each round | × builder |")
        print("|---|---:|---|---:|")
        for row, values in times.items():
            median = statistics.median(values)
            print(f"| {row} | {median:.2f} | {', '.join(f'{v:.2f}' for v in values)} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
