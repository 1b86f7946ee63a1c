#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (corpus/<target>/): small valid inputs and a few broken
ones, so that the fuzzers start from the formats' structure. Re-run after changing a seed;
inputs the fuzzers found are added by hand (copied from a run's scratch corpus) when they
cover something new.
  tests/fuzz/make_corpus.py"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    path = os.path.join(HERE, "corpus", target, name)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# --- openai_request: completion and chat bodies.
requests = {
    "completion_min": {"model": "tiny", "prompt": "hi"},
    "completion_full": {"prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0, "top_p": 0.5,
                        "top_k": 4, "seed": 7, "stop": ["x", "yz"], "stop_token_ids": [257],
                        "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}, "n": 1,
                        "skip_special_tokens": False, "add_special_tokens": False},
    "completion_batch_of_one": {"prompt": ["hello"], "max_tokens": 1},
    "completion_token_batch": {"prompt": [[5, 6]], "echo": False, "logprobs": None},
    "completion_huge_max": {"prompt": "a", "max_tokens": 9223372036854775807},
    "chat_min": {"messages": [{"role": "user", "content": "hey"}]},
    "chat_parts": {"messages": [{"role": "developer", "content": "be brief"},
                                {"role": "user", "content": [{"type": "text", "text": "a"},
                                                             {"type": "text", "text": "b"}]},
                                {"role": "assistant", "content": None}],
                   "max_completion_tokens": 3, "presence_penalty": 1.5},
    "chat_bad_role": {"messages": [{"role": "tool", "content": "x"}]},
    "tokenize_messages": {"messages": [{"role": "system", "content": "s"}],
                          "add_special_tokens": True},
}
for name, body in requests.items():
    write("openai_request", name + ".json", json.dumps(body))
write("openai_request", "truncated.json", '{"prompt": "a", "max_tokens": 1')
write("openai_request", "not_utf8.json", b'{"prompt": "\xff\xfe"}')
write("openai_request", "escapes.json", '{"prompt": "\\ud83d\\ude00 \\u0000", "stop": "\\n"}')

# --- sse_parser: first byte = number of cut points, then the cuts, then the stream.
def sse(cuts, stream):
    return bytes([len(cuts)] + cuts) + stream.encode()

chunk = json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [
    {"index": 0, "text": "he", "finish_reason": None}], "usage": None})
chat = json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "x"}}]})
usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
write("sse_parser", "completion_stream", sse([7, 40], f"data: {chunk}\n\ndata: {usage}\n\ndata: [DONE]\n\n"))
write("sse_parser", "crlf_and_comments", sse([3], f": keep-alive\r\n\r\ndata: {chat}\r\n\r\ndata: [DONE]\r\n\r\n"))
write("sse_parser", "multiline_cr", sse([1, 1, 1], "data: a\rdata: b\r\revent: x\nid: 1\ndata: c"))
write("sse_parser", "error_event", sse([], 'data: {"error": {"message": "boom", "code": 503}}\n\ndata: [DONE]\n\n'))
write("sse_parser", "timing", sse([20], 'data: {"choices": [{"text": ""}], "tandem_timing": {"queue_s": 0.1}}\n\n'))

# --- tokenizer_json: small byte-level and SentencePiece-style BPE tokenizers.
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}

b2u = bytes_to_unicode()
vocab = {b2u[b]: b for b in range(256)}
merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("ll", "o")]
for a, b in merges:
    vocab[a + b] = len(vocab)
byte_level = {
    "version": "1.0",
    "added_tokens": [{"id": len(vocab), "content": "<|begin|>", "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False, "special": True},
                     {"id": len(vocab) + 1, "content": "<|end|>", "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<|begin|>", "type_id": 0}},
                                  {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                {"Sequence": {"id": "B", "type_id": 1}}],
                       "special_tokens": {"<|begin|>": {"id": "<|begin|>", "ids": [len(vocab)],
                                                        "tokens": ["<|begin|>"]}}},
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
              "ignore_merges": False, "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
}
write("tokenizer_json", "byte_level_bpe.json", json.dumps(byte_level, ensure_ascii=False))

sp_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256):
    sp_vocab[f"<0x{b:02X}>"] = len(sp_vocab)
for piece in ["▁", "h", "e", "l", "o", "▁h", "he", "ll", "▁he", "llo"]:
    sp_vocab[piece] = len(sp_vocab)
sentencepiece = {
    "version": "1.0",
    "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}
                     for t, i in [("<unk>", 0), ("<s>", 1), ("</s>", 2)]],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "},
                                               "content": "▁"}]},
    "pre_tokenizer": None,
    "post_processor": None,
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
              "ignore_merges": False, "vocab": sp_vocab,
              "merges": [["▁", "h"], ["h", "e"], ["l", "l"], ["▁h", "e"], ["ll", "o"]]},
}
write("tokenizer_json", "sentencepiece_bpe.json", json.dumps(sentencepiece, ensure_ascii=False))
write("tokenizer_json", "not_json.json", '{"model": {"type": "BPE", ')
write("tokenizer_json", "unigram.json", json.dumps({"model": {"type": "Unigram", "vocab": []}}))

# --- safetensors: [u64 header length][JSON header][data].
def safetensors(tensors, metadata=None, pad=0, data=None):
    header = {}
    offset = 0
    blobs = b""
    for name, (dtype, shape, size) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        blobs += bytes((i * 7) & 255 for i in range(size))
        offset += size
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(text)) + text + (blobs if data is None else data)

write("safetensors", "two_tensors.safetensors", safetensors(
    {"w": ("BF16", [2, 3], 12), "b": ("F32", [3], 12)}, {"format": "pt"}))
write("safetensors", "scalar_and_empty.safetensors", safetensors(
    {"s": ("I64", [], 8), "e": ("F16", [0, 4], 0), "q": ("F8_E4M3", [4], 4), "u": ("U8", [2], 2)},
    pad=5))
write("safetensors", "truncated.safetensors", safetensors({"w": ("F32", [4], 16)}, data=b"\0" * 8))
write("safetensors", "header_too_long.safetensors", struct.pack("<Q", 1 << 40) + b"{}")
