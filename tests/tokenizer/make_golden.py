#!/usr/bin/env python3
"""Golden outputs for the tokenizer tests, produced by the reference implementations.

  encode DIR OUT   tokenizers: ids / decodes of CORPUS for DIR/{llama3,qwen2,llama2,mistral}
  chat DIR OUT     transformers: apply_chat_template(tokenize=False) of CONVERSATIONS
  agree DIR        check that transformers' AutoTokenizer gives the same ids and decodes as
                   tokenizers on the generated files in DIR (no output file; exit 1 if not)
  all BIN          regenerate the committed goldens (golden_encode.json, golden_chat.json)
                   with BIN = build/tests/write_tokenizer (needs tokenizers and transformers,
                   e.g. the reference env's python)

The C++ test runs `encode` live when python3 can import tokenizers, and always checks the
committed files. The tokenizer files are written by our WriteTokenizerFiles; each golden
records a hash of tokenizer.json so a changed writer asks for regeneration.
"""
import json
import os
import subprocess
import sys
import tempfile

from real_chat_templates import REAL_TEMPLATES

FAMILIES = ["llama3", "qwen2", "llama2", "mistral"]
# (directory name, family, vocab size): the tiny-model size, and one past what the embedded
# corpus yields (learned merges, then synthetic ones). tokenizer_test.cc writes the same list.
CONFIGS = [(f, f, 512) for f in FAMILIES] + [(f + "_8k", f, 8192) for f in FAMILIES]

CORPUS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    "  leading spaces",
    "trailing spaces   ",
    "multiple   spaces   inside",
    "\ttabs\tand\ttabs\t",
    "new\nlines\n\n\nand\r\nCRLF\r\n",
    " ",
    "\n",
    "   \n  \t ",
    "1234567890",
    "3.14159 and 2,718,281 and 0x7FFF",
    "Year 2024: 100% done in 7 days.",
    "I'm he's we'll they'd you've it's DON'T I'LL",
    "héllo wörld café naïve Ærø Straße",
    "Привет, мир! Γειά σου κόσμε",
    "你好，世界！今天天气很好。",
    "こんにちは世界 안녕하세요 مرحبا नमस्ते",
    "🎉🎉 party 🚀 time",
    "👨‍👩‍👧‍👦 family 👍🏽 ok flags 🇫🇷🇯🇵",
    "𝕳𝖊𝖑𝖑𝖔 ∮ ⅞ ᚠᛇᚻ 丂乇乂",
    "\u00a0nbsp\u3000ideographic\u2009thin space",
    "e\u0301 composed? \u212b angstrom \u2126 ohm \uf900 compat",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<s>[INST] Hi there [/INST] Hello!</s>",
    " <s> spaced </s> <unk> ",
    "text<tool_call>{\"name\": \"f\"}</tool_call> after",
    "<think>\nhmm\n</think>\n\nanswer",
    "<|im_end|><|im_end|>x<|im_sta",
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "int main() { return 0; }\t// done",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Mixed: naïve café 1234 你好 🎉 <|eot_id|> end",
]


def fuzz_corpus(count, seed):
    """Random mixes of the pieces tokenizers trip over: whitespace runs, digits, contractions,
    multi-byte and combining characters, emoji sequences, special tokens and their prefixes."""
    import random

    rng = random.Random(seed)
    pieces = [
        " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2009",
        "the", "The", "serving", "tokens", "Hello", "HELLO", "x", "_", "-", "...", "!?", "(", ")",
        "'s", "'S", "'ll", "'re", "n't", "'", "\"", "0", "7", "42", "1234", "3.14", "2024-01-01",
        "é", "e\u0301", "ß", "Ø", "ñ", "ç", "naïve", "Ωμέγα", "Привет", "你好", "世界", "東京",
        "こんにちは", "한국어", "مرحبا", "नमस्ते", "🎉", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "𝕳",
        "\u212b", "\uf900", "\u0300", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>",
        "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<tool_call>",
        "</think>", "<|im_", "<|eot", "<0x41>", "▁", "Ġ", "[INST]", "{", "}", "=>", "==", "//",
    ]
    texts = []
    for _ in range(count):
        texts.append("".join(rng.choice(pieces) for _ in range(rng.randint(1, 14))))
    return texts


CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"}],
    [
        {"role": "system", "content": "  Spaces around.\n"},
        {"role": "user", "content": "\n  padded question \t"},
    ],
    [{"role": "user", "content": "Übersetze: 你好 🎉"}, {"role": "assistant", "content": " 好的 "}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "empty system"}],
    [{"role": "system", "content": "Sys"}, {"role": "user", "content": "q1"},
     {"role": "assistant", "content": "a1"}, {"role": "system", "content": "late system"}],
    [{"role": "user", "content": "a<|im_end|>b [INST] c"}, {"role": "assistant", "content": ""}],
    [],
    [{"role": "assistant", "content": "I speak first"}],
    [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
]



# Pipelines our four families do not use, as patches (RFC 7386 merge) over a generated file: the
# C++ test applies the same patch to its own generated file.
BYTE_LEVEL_GPT2 = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                   "use_regex": True}
VARIANTS = {
    "gpt2_style": ("llama3", {
        "pre_tokenizer": BYTE_LEVEL_GPT2, "post_processor": BYTE_LEVEL_GPT2,
        "model": {"ignore_merges": False}}),
    "split_behaviors": ("qwen2", {
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
             "invert": False},
            {"type": "Split", "pattern": {"Regex": "[,.;:!?]"}, "behavior": "MergedWithNext",
             "invert": False},
            {"type": "Split", "pattern": {"Regex": "\\p{L}+"}, "behavior": "Contiguous",
             "invert": True},
            {"type": "Split", "pattern": {"String": "\t"}, "behavior": "Removed", "invert": False},
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]}}),
    "metaspace_always_split": ("llama2", {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "always", "split": True},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
             "split": True}]}}),
    "normalizers": ("qwen2", {
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFKC"},
            {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
            {"type": "Strip", "strip_left": True, "strip_right": True},
            {"type": "Prepend", "prepend": "^"}]}}),
    "added_token_flags": ("llama3", {
        "added_tokens": None,  # replaced below: the base list plus flagged tokens
    }),
    "normalized_added_tokens_llama2": ("llama2", {"added_tokens": None}),  # replaced below
    "normalized_added_tokens_qwen2": ("qwen2", {"added_tokens": None}),  # replaced below
}


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def variant_patch(name, base_json):
    _, patch = VARIANTS[name]
    if name == "added_token_flags":
        next_id = max(t["id"] for t in base_json["added_tokens"]) + 1
        extra = [("<mask>", True, False, False, True), ("[SEP]", False, True, False, True),
                 ("hello", False, False, True, False), ("ab", True, True, False, False)]
        tokens = list(base_json["added_tokens"])
        for i, (content, lstrip, rstrip, single_word, special) in enumerate(extra):
            tokens.append({"id": next_id + i, "content": content, "single_word": single_word,
                           "lstrip": lstrip, "rstrip": rstrip, "normalized": False,
                           "special": special})
        patch = {"added_tokens": tokens}
    elif name.startswith("normalized_added_tokens"):
        # The base tokens become normalized=true (matched after the normalizer, by their
        # normalized content), plus a token the normalizer rewrites.
        next_id = max([t["id"] + 1 for t in base_json["added_tokens"]] +
                      [len(base_json["model"]["vocab"])])
        tokens = [dict(t, normalized=True) for t in base_json["added_tokens"]]
        content = "wor ld" if name.endswith("llama2") else "e\u0301t\u00e9"
        tokens.append({"id": next_id, "content": content, "single_word": False, "lstrip": False,
                       "rstrip": False, "normalized": True, "special": False})
        patch = {"added_tokens": tokens}
    return patch

VARIANT_TEXTS = [
    "Hello <mask> world [SEP]   next hello, say hello! ahello hellob ab  ab  cab",
    "  <mask>  [SEP]\t\t x",
    "hello wor ld<s>wor ld </s> été e\u0301te\u0301 <|im_start|>été",
]


def tokenizer_hash(directory):
    """FNV-1a 64 of tokenizer.json (the C++ test recomputes it)."""
    h = 0xCBF29CE484222325
    with open(os.path.join(directory, "tokenizer.json"), "rb") as f:
        for b in f.read():
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def encode_cases(tok, texts):
    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=True).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        cases.append({
            "text": text,
            "ids": ids,
            "ids_no_special": plain,
            "decode": tok.decode(ids, skip_special_tokens=False),
            "decode_skip_special": tok.decode(ids, skip_special_tokens=True),
            # Dropping the last token may cut a character: exercises U+FFFD rules.
            "decode_truncated": tok.decode(plain[:-1], skip_special_tokens=False),
        })
    return cases


def encode_goldens(root, fuzz_small, fuzz_max):
    """fuzz_small / fuzz_max: random texts added for the 512-token / 8k vocabularies."""
    from tokenizers import Tokenizer

    out = {}
    for name, _, vocab_size in CONFIGS:
        directory = os.path.join(root, name)
        tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        small = vocab_size == 512
        texts = CORPUS + fuzz_corpus(fuzz_small if small else fuzz_max, 1234 if small else 99)
        out[name] = {"tokenizer_fnv1a64": tokenizer_hash(directory),
                     "vocab_size": tok.get_vocab_size(), "cases": encode_cases(tok, texts)}
    for name, (base, _) in VARIANTS.items():
        with open(os.path.join(root, base, "tokenizer.json"), encoding="utf-8") as f:
            base_json = json.load(f)
        patch = variant_patch(name, base_json)
        tok = Tokenizer.from_str(json.dumps(merge_patch(base_json, patch)))
        out["variant_" + name] = {
            "base": base, "patch": patch,
            "tokenizer_fnv1a64": tokenizer_hash(os.path.join(root, base)),
            "vocab_size": tok.get_vocab_size(),
            "cases": encode_cases(tok, CORPUS + VARIANT_TEXTS)}
    return out


def render(tok, template):
    cases = []
    for messages in CONVERSATIONS:
        for add_generation_prompt in (False, True):
            case = {"messages": messages, "add_generation_prompt": add_generation_prompt}
            try:
                case["text"] = tok.apply_chat_template(
                    messages, chat_template=template, tokenize=False,
                    add_generation_prompt=add_generation_prompt)
            except Exception as e:  # the template's raise_exception, or an empty conversation
                case["error"] = str(e)
            cases.append(case)
    return cases


def chat_goldens(root):
    """Per family: our generated template's renderings ("cases") and the real checkpoints'
    templates' ("real": name, template text, cases)."""
    from transformers import AutoTokenizer

    out = {}
    for family in FAMILIES:
        directory = os.path.join(root, family)
        tok = AutoTokenizer.from_pretrained(directory)
        real = [{"name": name, "template": text, "cases": render(tok, text)}
                for name, text in REAL_TEMPLATES[family].items()]
        out[family] = {"tokenizer_fnv1a64": tokenizer_hash(directory),
                       "cases": render(tok, None), "real": real}
    return out


def check_agreement(root):
    """transformers (which may rebuild a tokenizer's pipeline from its class) must agree with
    tokenizers on our files, or parity tests through transformers would see other ids."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    bad = 0
    for family in FAMILIES:
        directory = os.path.join(root, family)
        tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        auto = AutoTokenizer.from_pretrained(directory)
        for text in CORPUS + fuzz_corpus(300, 5):
            for add in (True, False):
                ids = tok.encode(text, add_special_tokens=add).ids
                if ids != auto(text, add_special_tokens=add)["input_ids"]:
                    bad += 1
                    print("encode differs:", family, add, repr(text))
                elif tok.decode(ids, skip_special_tokens=False) != auto.decode(
                        ids, skip_special_tokens=False):
                    bad += 1
                    print("decode differs:", family, repr(text))
    print("transformers vs tokenizers: %d differences" % bad)
    return bad == 0


def write_json(data, path):
    """One case per line, so diffs stay readable."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        for i, (family, entry) in enumerate(data.items()):
            f.write(" %s: {\n" % json.dumps(family))
            for key, value in entry.items():
                if key != "cases":
                    f.write("  %s: %s,\n" % (json.dumps(key), json.dumps(value)))
            f.write('  "cases": [\n')
            cases = entry["cases"]
            for j, case in enumerate(cases):
                sep = "," if j + 1 < len(cases) else ""
                f.write("   %s%s\n" % (json.dumps(case, ensure_ascii=False, separators=(",", ":")), sep))
            f.write("  ]\n }%s\n" % ("," if i + 1 < len(data) else ""))
        f.write("}\n")


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "encode" and len(sys.argv) == 4:
        # Live runs are cheap: a wider random corpus (TANDEM_TOKENIZER_FUZZ=N for bug hunts).
        fuzz = int(os.environ.get("TANDEM_TOKENIZER_FUZZ", "200"))
        write_json(encode_goldens(sys.argv[2], fuzz, fuzz), sys.argv[3])
    elif mode == "chat" and len(sys.argv) == 4:
        write_json(chat_goldens(sys.argv[2]), sys.argv[3])
    elif mode == "agree" and len(sys.argv) == 3:
        sys.exit(0 if check_agreement(sys.argv[2]) else 1)
    elif mode == "all" and len(sys.argv) == 3:
        here = os.path.dirname(os.path.abspath(__file__))
        with tempfile.TemporaryDirectory() as root:
            for name, family, vocab_size in CONFIGS:
                os.makedirs(os.path.join(root, name))
                subprocess.run([sys.argv[2], os.path.join(root, name), family, str(vocab_size)],
                               check=True, stdout=subprocess.DEVNULL)
            write_json(encode_goldens(root, 25, 0), os.path.join(here, "golden_encode.json"))
            write_json(chat_goldens(root), os.path.join(here, "golden_chat.json"))
            if not check_agreement(root):
                sys.exit("transformers and tokenizers disagree on the generated files")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
