"""Record llama-quantize's per-tensor type choices for small qwen3 models: fixtures/llama_quantize_types.json.

How the fixture was made: llama.cpp from the llama-cpp-python 0.3.36 sdist (vendor/llama.cpp, build
0c1e570), `cmake --build BUILD --target llama-quantize`, then

    python tests/synth/make_type_mix_fixture.py /path/to/llama-quantize

For each model below this writes an F32 qwen3 GGUF with its own GGUFWriter code (hidden 256,
head_dim 128, FFN 512: every width a multiple of 256 like the real presets, so no block-size
fallback), quantizes it to every type gufo synth supports, and records each tensor's type and the
file's general.file_type as llama-quantize wrote them (read back with gguf.GGUFReader). A type that
llama-quantize refuses without an importance matrix (the IQ1/IQ2/IQ3_XXS mixes) is made with one
(all ones; only its presence changes the types chosen), and the fixture records that it was. The models
cover the real presets' layer counts and the GQA ratios the rules look at (< 4, >= 4), tied and untied.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

FIXTURE = Path(__file__).parent / "fixtures" / "llama_quantize_types.json"
HIDDEN, HEAD_DIM, FFN, VOCAB = 256, 128, 512, 512
FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "tie_word_embeddings")
MODELS = [
    dict(zip(FIELDS, values, strict=True))
    for values in [(28, 2, 1, True), (36, 4, 1, False), (40, 10, 2, False)]
]
QTYPES = ["F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L"]
QTYPES += ["Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K"]
QTYPES += ["IQ4_NL", "IQ4_XS", "IQ3_M", "IQ3_S", "IQ3_XS", "IQ3_XXS", "IQ2_M", "IQ2_S", "IQ2_XS", "IQ2_XXS"]
QTYPES += ["IQ1_M", "IQ1_S", "TQ2_0", "TQ1_0"]


def write_f32_model(path: Path, model: dict) -> None:
    rng = np.random.default_rng(0)
    heads, kv = model["num_attention_heads"], model["num_key_value_heads"]
    writer = GGUFWriter(path, "qwen3")
    writer.add_block_count(model["num_hidden_layers"])
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(0)  # ALL_F32

    def add(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    add("token_embd.weight", VOCAB, HIDDEN)
    add("output_norm.weight", HIDDEN)
    if not model["tie_word_embeddings"]:
        add("output.weight", VOCAB, HIDDEN)
    for i in range(model["num_hidden_layers"]):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", HIDDEN)
        add(p + "attn_q.weight", heads * HEAD_DIM, HIDDEN)
        add(p + "attn_k.weight", kv * HEAD_DIM, HIDDEN)
        add(p + "attn_v.weight", kv * HEAD_DIM, HIDDEN)
        add(p + "attn_output.weight", HIDDEN, heads * HEAD_DIM)
        add(p + "attn_q_norm.weight", HEAD_DIM)
        add(p + "attn_k_norm.weight", HEAD_DIM)
        add(p + "ffn_norm.weight", HIDDEN)
        add(p + "ffn_gate.weight", FFN, HIDDEN)
        add(p + "ffn_up.weight", FFN, HIDDEN)
        add(p + "ffn_down.weight", HIDDEN, FFN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_imatrix(path: Path, source: Path) -> None:
    """An importance matrix of ones for every matrix of `source`, in llama.cpp's legacy imatrix format
    (entries: name, calls, values; then the chunk count and the dataset name)."""
    out = bytearray()
    matrices = [t for t in GGUFReader(source).tensors if len(t.shape) == 2]
    out += struct.pack("<i", len(matrices))
    for tensor in matrices:
        name = tensor.name.encode()
        width = int(tensor.shape[0])  # gguf's shape lists the row width first
        out += struct.pack("<i", len(name)) + name + struct.pack("<ii", 1, width)
        out += np.ones(width, np.float32).tobytes()
    dataset = b"ones"
    out += struct.pack("<ii", 1, len(dataset)) + dataset
    path.write_bytes(bytes(out))


def quantize_to(quantize: str, source: Path, target: Path, qtype: str, imatrix: Path) -> bool:
    """Quantize as llama-quantize does by default; where it refuses for want of an importance matrix,
    with `imatrix`. Whether one was needed."""
    plain = subprocess.run([quantize, str(source), str(target), qtype], capture_output=True, text=True)
    if plain.returncode == 0:
        return False
    if "requires an imatrix" not in plain.stdout + plain.stderr:
        raise RuntimeError(f"llama-quantize {qtype} failed: {plain.stderr[-2000:]}")
    command = [quantize, "--imatrix", str(imatrix), str(source), str(target), qtype]
    subprocess.run(command, check=True, capture_output=True)
    return True


def types_by_kind(path: Path, n_layers: int) -> tuple[int, dict[str, str]]:
    """(general.file_type, {"token_embd": type, ..., "attn_v": "type of layer 0, of layer 1, ...", ...})."""
    reader = GGUFReader(path)
    file_type = int(reader.get_field("general.file_type").contents())
    kinds: dict[str, str] = {}
    per_layer: dict[str, list[str]] = {}
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if parts[0] == "blk":
            per_layer.setdefault(parts[2], [""] * n_layers)[int(parts[1])] = tensor.tensor_type.name
        else:
            kinds[parts[0]] = tensor.tensor_type.name
    return file_type, kinds | {kind: " ".join(types) for kind, types in per_layer.items()}


def main(quantize: str) -> None:
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            source, imatrix = Path(tmp) / "f32.gguf", Path(tmp) / "imatrix.dat"
            write_f32_model(source, model)
            write_imatrix(imatrix, source)
            mixes = {}
            for qtype in QTYPES:
                target = Path(tmp) / f"{qtype}.gguf"
                needed = quantize_to(quantize, source, target, qtype, imatrix)
                file_type, kinds = types_by_kind(target, model["num_hidden_layers"])
                mixes[qtype] = {"file_type": file_type, "imatrix": needed, "types": kinds}
            shape = {"hidden_size": HIDDEN, "intermediate_size": FFN, "head_dim": HEAD_DIM, **model}
            records.append({"shape": shape, "vocab_size": VOCAB, "mixes": mixes})
    FIXTURE.parent.mkdir(exist_ok=True)
    made_by = (
        "tests/synth/make_type_mix_fixture.py with llama-quantize from llama-cpp-python 0.3.36 (0c1e570)"
    )
    FIXTURE.write_text(json.dumps({"made_by": made_by, "models": records}, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_type_mix_fixture.py PATH/TO/llama-quantize")
    main(sys.argv[1])
