#!/usr/bin/env python3
"""A mid-size random Qwen3-MoE checkpoint (bf16 safetensors) for load-time
measurements (peak RSS of an all-GPU run, bench/README.md): hidden 1024,
8 layers of 64 experts of 512, the tiny fixture's tokenizer and vocabulary.

Usage: make_synthetic_qwen3moe.py OUT_DIR TOKENIZER_DIR [LAYERS] [bf16|f32]
"""
import json, math, os, random, shutil, struct, sys

out, tok = sys.argv[1], sys.argv[2]
layers = int(sys.argv[3]) if len(sys.argv) > 3 else 8
f32 = len(sys.argv) > 4 and sys.argv[4] == "f32"
ES = 4 if f32 else 2  # bytes per element
H, I, E, K, NH, KVH, HD, V = 1024, 512, 64, 8, 16, 4, 64, 151936
cfg = json.load(open(os.path.join(tok, "config.json")))
cfg.update(hidden_size=H, intermediate_size=4 * I, moe_intermediate_size=I, num_hidden_layers=layers, num_attention_heads=NH,
           num_key_value_heads=KVH, head_dim=HD, num_experts=E, num_experts_per_tok=K, vocab_size=V, max_window_layers=layers,
           torch_dtype="float32" if f32 else "bfloat16")
os.makedirs(out, exist_ok=True)
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    if os.path.exists(os.path.join(tok, f)):
        shutil.copy(os.path.join(tok, f), out)
shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
for l in range(layers):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                   p + "self_attn.q_proj.weight": (NH * HD, H), p + "self_attn.k_proj.weight": (KVH * HD, H),
                   p + "self_attn.v_proj.weight": (KVH * HD, H), p + "self_attn.o_proj.weight": (H, NH * HD),
                   p + "self_attn.q_norm.weight": (HD,), p + "self_attn.k_norm.weight": (HD,), p + "mlp.gate.weight": (E, H)})
    for e in range(E):
        q = f"{p}mlp.experts.{e}."
        shapes.update({q + "gate_proj.weight": (I, H), q + "up_proj.weight": (I, H), q + "down_proj.weight": (H, I)})
header, off = {}, 0
for name, shape in shapes.items():
    n = math.prod(shape) * ES
    header[name] = {"dtype": "F32" if f32 else "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
    off += n
hj = json.dumps(header).encode()
hj += b" " * ((8 - len(hj) % 8) % 8)
# Matrices: a block of 65521 (prime) random values ~ N(0, 0.02) repeated;
# norms: 1.0. Random enough for a load-time measurement, never NaN.
random.seed(7)
block = b"".join(struct.pack("<f", random.gauss(0, 0.02))[4 - ES:] for _ in range(65521))
one = struct.pack("<f", 1.0)[4 - ES:]
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hj)) + hj)
    for name, shape in shapes.items():
        n = math.prod(shape)
        if len(shape) == 1:
            f.write(one * n)
            continue
        full, rest = divmod(ES * n, len(block))
        f.write(block * full + block[:rest])
print(f"{out}: {off / 1e9:.2f} GB of {'f32' if f32 else 'bf16'} weights, {layers} layers")
