#!/usr/bin/env python3
"""Writes a quantized checkpoint in a real format's layout with numpy, independently of tandem.

Reads the unquantized checkpoint BASE (one model.safetensors, from `tandem make-model`), and for
every decoder linear layer (*_proj.weight) draws random codes and scales, packs them as the
format's documentation describes, and writes:
  OUT/config.json          BASE's config plus the format's quantization_config
  OUT/model.safetensors    the packed tensors, every other tensor copied from BASE
  DENSE/model.safetensors  "<module>.weight" F32 [n, k]: the dequantized weight, computed here
quant_layout_test loads OUT with tandem's loader and checks its dequantized weights equal DENSE.

Layouts (as shipped by the tools that write them):
  fp8-block    transformers FineGrainedFP8 / Qwen3-8B-FP8: weight F8_E4M3 [n, k], weight_scale_inv
               F32 [ceil(n/128), ceil(k/128)], w = fp8(weight) * scale_inv[j // 128, kk // 128]
  fp8-channel  compressed-tensors float-quantized: weight F8_E4M3 [n, k], weight_scale BF16
               [n, 1], w = fp8(weight) * scale[j]
  int8         compressed-tensors int-quantized: weight I8 [n, k], weight_scale BF16 [n, 1]
  awq          AutoAWQ GEMM: qweight I32 [k, n/8], qzeros I32 [k/g, n/8], scales F16 [k/g, n];
               int32 nibble i holds column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i];
               w = (q - z) * s
  gptq, gptq-v2  AutoGPTQ: qweight I32 [k/8, n] (nibble i of row r = k index 8r + i), qzeros I32
               [k/g, n/8] (nibble i = column 8c + i), scales F16 [k/g, n], g_idx I32 [k];
               w = (q - (z + 1)) * s for checkpoint_format gptq, (q - z) * s for gptq_v2
Exit code 77: numpy is missing (the test is then skipped).
"""
import argparse
import json
import os
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is not installed", file=sys.stderr)
    sys.exit(77)

DTYPES = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "F16": (np.float16, 2),
          "F8_E4M3": (np.uint8, 1), "I8": (np.int8, 1), "I32": (np.int32, 4), "U8": (np.uint8, 1)}
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=DTYPES[info["dtype"]][0]).reshape(info["shape"])
        out[name] = (info["dtype"], arr)
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def e4m3_to_f32(codes):
    codes = codes.astype(np.int32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = (codes & 0x7).astype(np.float64)
    normal = (1.0 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7.0)
    sub = man / 8.0 * 2.0 ** -6
    return (sign * np.where(exp == 0, sub, normal)).astype(np.float32)


def pack_nibbles(values, axis_len_8, order):
    """values [..., 8*c] uint -> int32 [..., c], nibble i = values[..., 8c + order[i]]."""
    v = values.astype(np.uint32).reshape(values.shape[:-1] + (axis_len_8, 8))
    word = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i in range(8):
        word |= v[..., order[i]] << np.uint32(4 * i)
    return word.view(np.int32)


def quantize_module(fmt, n, k, group, rng):
    """Random codes and scales of one [n, k] layer: (tensors by suffix, dense f32 [n, k])."""
    if fmt in ("fp8-block", "fp8-channel"):
        codes = rng.integers(0, 256, size=(n, k), dtype=np.int32)
        codes[(codes & 0x7F) == 0x7F] = 0x38  # no NaN codes
        codes = codes.astype(np.uint8)
        if fmt == "fp8-block":
            rows, cols = -(-n // 128), -(-k // 128)
            scale = rng.uniform(1e-3, 2e-2, size=(rows, cols)).astype(np.float32)
            full = np.repeat(np.repeat(scale, 128, axis=0), 128, axis=1)[:n, :k]
            return ({"weight": ("F8_E4M3", codes), "weight_scale_inv": ("F32", scale)},
                    e4m3_to_f32(codes) * full)
        scale = (rng.uniform(1e-3, 2e-2, size=(n, 1)).astype(np.float32).view(np.uint32)
                 >> 16).astype(np.uint16)  # bf16 bits (truncated: any bf16 will do)
        return ({"weight": ("F8_E4M3", codes), "weight_scale": ("BF16", scale)},
                e4m3_to_f32(codes) * bf16_to_f32(scale))
    if fmt == "int8":
        codes = rng.integers(-128, 128, size=(n, k)).astype(np.int8)
        scale = (rng.uniform(1e-3, 2e-2, size=(n, 1)).astype(np.float32).view(np.uint32)
                 >> 16).astype(np.uint16)
        return ({"weight": ("I8", codes), "weight_scale": ("BF16", scale)},
                codes.astype(np.float32) * bf16_to_f32(scale))
    groups = k // group
    q = rng.integers(0, 16, size=(k, n)).astype(np.uint32)       # q[kk, j]
    z = rng.integers(0, 16, size=(groups, n)).astype(np.uint32)  # stored zeros [g, j]
    s = rng.uniform(1e-3, 2e-2, size=(groups, n)).astype(np.float16)
    g_of_k = np.arange(k) // group
    if fmt == "awq":
        zero = z.astype(np.float32)
        tensors = {"qweight": ("I32", pack_nibbles(q, n // 8, AWQ_ORDER)),
                   "qzeros": ("I32", pack_nibbles(z, n // 8, AWQ_ORDER)),
                   "scales": ("F16", s)}
    else:
        zero = z.astype(np.float32) + (1.0 if fmt == "gptq" else 0.0)
        qt = q.reshape(k // 8, 8, n)  # [r, i, j]: k index 8r + i
        qweight = np.zeros((k // 8, n), dtype=np.uint32)
        for i in range(8):
            qweight |= qt[:, i, :] << np.uint32(4 * i)
        tensors = {"qweight": ("I32", qweight.view(np.int32)),
                   "qzeros": ("I32", pack_nibbles(z, n // 8, list(range(8)))),
                   "scales": ("F16", s),
                   "g_idx": ("I32", g_of_k.astype(np.int32))}
    dense = (q.astype(np.float32) - zero[g_of_k]) * s.astype(np.float32)[g_of_k]  # [k, n]
    return tensors, np.ascontiguousarray(dense.T)


def quantization_config(fmt, group):
    ct = lambda t, f, act: {
        "quant_method": "compressed-tensors", "format": f, "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": t, "strategy": "channel", "symmetric": True,
            "dynamic": False}, "input_activations": act}}, "ignore": ["lm_head"]}
    return {
        "fp8-block": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                      "weight_block_size": [128, 128]},
        "fp8-channel": ct("float", "float-quantized", {"num_bits": 8, "type": "float",
                                                       "strategy": "token", "dynamic": True,
                                                       "symmetric": True}),
        "int8": ct("int", "int-quantized", None),
        "awq": {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                "version": "gemm"},
        "gptq": {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False,
                 "sym": False, "checkpoint_format": "gptq"},
        "gptq-v2": {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False,
                    "sym": False, "checkpoint_format": "gptq_v2"},
    }[fmt]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True)
    p.add_argument("--format", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dense", required=True)
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    base = read_safetensors(os.path.join(a.base, "model.safetensors"))
    out, dense = {}, {}
    for name, (dtype, arr) in base.items():
        if not (name.endswith("_proj.weight") and "layers." in name):
            out[name] = (dtype, arr)
            continue
        module = name[: -len(".weight")]
        tensors, w = quantize_module(a.format, arr.shape[0], arr.shape[1], a.group, rng)
        for suffix, t in tensors.items():
            out[module + "." + suffix] = t
        dense[name] = ("F32", w.astype(np.float32))
    for d in (a.out, a.dense):
        os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"), out)
    write_safetensors(os.path.join(a.dense, "model.safetensors"), dense)
    with open(os.path.join(a.base, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = quantization_config(a.format, a.group)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
