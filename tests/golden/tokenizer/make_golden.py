#!/usr/bin/env python3
"""Makes smollm2_cases.json: token ids from a reference tokenizer built from the same GGUF.

Usage:
  pip install transformers tokenizers gguf      # no torch needed
  python3 tests/golden/tokenizer/make_golden.py [MODEL.gguf] [OUT.json]

The reference is Hugging Face's own GGUF -> tokenizers conversion
(transformers.integrations.gguf.convert_gguf_tokenizer, the code behind
AutoTokenizer.from_pretrained(dir, gguf_file=...)). We call it directly because
transformers' GGUF *file reader* imports torch, which the tokenizer does not need.

One correction: transformers (5.x) has no split rule for tokenizer.ggml.pre = "smollm", so its
converted tokenizer uses the plain GPT-2 pre-tokenizer. The tokenizer.json that SmolLM2 ships
(and llama.cpp's "smollm" pre-type) first isolates every digit (Digits(individual_digits=True))
and then applies the GPT-2 byte-level regex. We set that pre-tokenizer, so the golden ids are
what the model was trained with. The script prints how many cases the uncorrected conversion
would have got differently, so the correction stays visible.

Also writes pretokenizer_cases.json: for the pre-tokenizer regexes of gpt2, llama3 (llama-bpe),
qwen2 and smollm, the UTF-8 byte offsets where HF tokenizers' Split(..., "isolated") ends each piece
of every corpus text. This checks our PCRE2 splitting against HF's regex engine for vocabularies
we have no model file for.

Each case: {"text", "ids" (special-token text parsed as special, add_special_tokens=False),
"ids_plain" (split_special_tokens=True: special-token text tokenized as plain text),
"decoded" (HF's decode of ids), "roundtrip" (decoded == text; false only when the vocabulary
has no token for some byte of the text)}.
The corpus is generated deterministically below (fixed seed); rerunning gives the same file.
"""
import json
import os
import random
import sys

DEFAULT_MODEL = os.path.join(
    os.environ.get("TROUPE_HOME", os.path.expanduser("~/.cache/troupe")),
    "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def handwritten_cases():
    return [
        # ASCII prose
        "Hello world",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "It was the best of times, it was the worst of times.",
        "A man, a plan, a canal: Panama",
        "In 1492, Columbus sailed the ocean blue.",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
        "HELLO WORLD",
        "hello world",
        "hElLo WoRlD",
        "a",
        " ",
        "  ",
        "x",
        "!",
        "I",
        "supercalifragilisticexpialidocious",
        "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
        # contractions
        "I'm sure you're right, but it's not what we'd've done.",
        "don't can't won't shouldn't",
        "DON'T CAN'T I'M YOU'RE",
        "'s 't 're 've 'm 'll 'd",
        "'S 'T 'RE 'VE 'M 'LL 'D",
        "the dog's bone, the dogs' bones",
        "rock 'n' roll",
        "''quoted''",
        "O'Brien's",
        # whitespace
        "a  b",
        "a   b",
        "a    b    c",
        "    leading spaces",
        "trailing spaces    ",
        "tab\tseparated\tvalues",
        "\t\tindented with tabs",
        "line one\nline two\nline three",
        "windows\r\nline\r\nendings",
        "\n",
        "\n\n",
        "\n\n\n\n",
        " \n \n ",
        "a\n\n\nb",
        "para one.\n\npara two.",
        "mixed \t \n \r\n whitespace",
        "\u00a0non-breaking\u00a0space",
        "em\u2003space and thin\u2009space",
        "ideographic\u3000space",
        "next\u0085line",
        "line\u2028separator",
        "zero\u200bwidth\u200bspace",
        "   \t   ",
        # numbers
        "0",
        "7",
        "42",
        "123",
        "1234",
        "12345678901234567890",
        "3.14159265358979",
        "-273.15",
        "1,000,000",
        "1e-10",
        "0x1F 0b1010 0o777",
        "Version 2.0.1-beta+build.42",
        "Call 555-0123 or +1 (800) 555-0199",
        "2024-01-15T10:30:00Z",
        "The year 2023 had 365 days.",
        "ratio 16:9 and 4/3",
        "$19.99 and \u20ac5,50 and \u00a3100",
        "50% off!!!",
        "\u0661\u0662\u0663 Arabic-Indic digits",
        "\u0967\u0968\u0969 Devanagari digits",
        "\uff11\uff12\uff13 fullwidth digits",
        "\u00bd \u00bc \u2153 fractions",
        "x\u00b2 + y\u00b3 = z\u00b9",
        "\u2460\u2461\u2462 circled",
        "\u2167 Roman numeral eight",
        # code
        "def add(a, b):\n    return a + b\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }",
        "fn main() {\n    let v: Vec<u8> = vec![1, 2, 3];\n    println!(\"{:?}\", v);\n}",
        "const f = async (x) => { await g(x?.y ?? 0); };",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
        "<div class=\"container\"><p>Hello</p></div>",
        "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
        "x = [i**2 for i in range(10) if i % 2 == 0]",
        "if err != nil {\n\t\treturn nil, fmt.Errorf(\"failed: %w\", err)\n\t}",
        "public static void main(String[] args) throws Exception {}",
        "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done",
        "template <typename T>\nstd::vector<T> v{};",
        "a->b; c::d; e => f; g |= h; i <<= 2; j && k || !l",
        "    // comment\n    /* block */\n    # hash",
        "x==y!=z<=w>=v",
        "print('hello')  # comment",
        "@decorator\nclass Foo(Bar):\n    pass",
        "https://example.com/path?query=1&other=two#frag",
        "user.name+tag@example.co.uk",
        "C:\\Users\\name\\Documents\\file.txt",
        "/usr/local/bin/python3.11",
        "snake_case camelCase PascalCase kebab-case SCREAMING_SNAKE",
        "__init__ __main__ _private",
        "matrix[i][j] = matrix[j][i];",
        "\\begin{equation} E = mc^2 \\end{equation}",
        "| col1 | col2 |\n|------|------|\n| a    | b    |",
        "- item one\n- item two\n  - nested",
        "```python\nprint(1)\n```",
        # punctuation runs
        "...",
        "!!!???",
        "?!?!",
        "--- *** ___ ===",
        "((()))[[[]]]{{{}}}",
        "\"quoted\" 'single' `backtick`",
        "\u201csmart quotes\u201d and \u2018single\u2019",
        "em\u2014dash en\u2013dash",
        "ellipsis\u2026",
        "\u00bfQu\u00e9? \u00a1S\u00ed!",
        "~!@#$%^&*()_+-=[]{}|;':\",./<>?",
        "<<>>",
        ">>> prompt",
        "****bold****",
        # CJK
        "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
        "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8\u3002",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002",
        "\u3053\u3093\u306b\u3061\u306f\u3001\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4",
        "\u4e2d\u6587 English \u6df7\u5408 mixed",
        "\u6f22\u5b57\u304b\u306a\u4ea4\u3058\u308a\u6587",
        "\U0002000B\U0002000C rare CJK extension B",
        # emoji
        "\U0001F600",
        "I love \U0001F355 and \U0001F37A!",
        "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family",
        "\U0001F3F3\ufe0f\u200d\U0001F308 flag",
        "\U0001F44D\U0001F3FD thumbs up medium skin",
        "\U0001F1FA\U0001F1F8\U0001F1EF\U0001F1F5 flags",
        "\u2764\ufe0f heart",
        "\U0001F9D1\u200d\U0001F4BB coder",
        "#\ufe0f\u20e3 keycap",
        "\U0001F600\U0001F601\U0001F602\U0001F923\U0001F603",
        "emoji\U0001F680in\U0001F30Ctext",
        # combining marks / accents
        "caf\u00e9 na\u00efve r\u00e9sum\u00e9",
        "cafe\u0301 nai\u0308ve",
        "Z\u0351\u0368\u0346a\u0352\u034al\u0363\u034cg\u0306o\u0308",
        "\u00c5ngstr\u00f6m vs A\u030angstro\u0308m",
        "Stra\u00dfe Gr\u00fc\u00dfe",
        "\u0130stanbul \u0131\u015f\u0131k",
        "\u1e9e capital sharp s",
        "\ufb01 ligature \ufb02",
        # RTL and Indic
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "\u0627\u0644\u0633\u0644\u0627\u0645 \u0639\u0644\u064a\u0643\u0645 123",
        "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
        "\u05d1\u05bc\u05b0\u05e8\u05b5\u05d0\u05e9\u05b4\u05c1\u05d9\u05ea with niqqud",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
        "\u0939\u093f\u0928\u094d\u0926\u0940 \u092e\u0947\u0902 \u0932\u093f\u0916\u093e \u0917\u092f\u093e",
        "\u0ba4\u0bae\u0bbf\u0bb4\u0bcd \u0b8e\u0bb4\u0bc1\u0ba4\u0bcd\u0ba4\u0bc1",
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
        "mixed \u0639\u0631\u0628\u064a and English",
        "\u202eright-to-left override\u202c",
        # other scripts
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
        "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
        "\u0532\u0561\u0580\u0565\u0582 \u0561\u0577\u056d\u0561\u0580\u0570",
        "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
        "\u1200\u120b\u121d \u12a0\u121b\u122d\u129b",
        "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u",
        "\u0e9e\u0eb2\u0eaa\u0eb2\u0ea5\u0eb2\u0ea7",
        "\U00010348 gothic hwair",
        "\U0001D400\U0001D401 math bold",
        "\u2200x\u2208\u211d: x\u00b2 \u2265 0",
        "\u2192 \u21d2 \u2194 \u221e \u2211 \u220f",
        "\u00a9 \u00ae \u2122 \u00a7 \u00b6",
        "\u2603\u2604\u2605",
        "\ufeffBOM at start",
        "\ufffd replacement char",
        "\u0000 nul byte",
        "control\u0001\u0002\u0007chars",
        "\u007f delete",
        "a\u0014b\u0004c",  # bytes SmolLM2's vocabulary has no token for: dropped
        "\U00050000 plane 5",  # lead byte 0xF1 has no token either
        "\U000F0000 private use plane 15",
        # special-token text
        "<|im_start|>user\nHello<|im_end|>",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>",
        "text before<|endoftext|>text after",
        "<|im_start|><|im_end|>",
        "<|im_start|> spaced <|im_end|>",
        " <|im_start|>",
        "<|im_start|",
        "<|im_end>",
        "<|IM_START|>",
        "<repo_name>troupe<file_sep>main.cpp",
        "<jupyter_start><jupyter_code>print(1)<jupyter_output>1",
        "<empty_output>",
        "<|endoftext|><|endoftext|>",
        "<|im_start|>user\n\u4f60\u597d\U0001F600<|im_end|>",
        "<s> </s> <unk> [INST] not special here",
    ]


def generated_cases(rng):
    """Random mixtures of the building blocks above, plus long inputs."""
    words = ["the", "of", "and", "token", "model", "inference", "GPU", "kernel", "x", "I", "a",
             "\u4f60\u597d", "\u4e16\u754c", "caf\u00e9", "\u043c\u0438\u0440", "\u0645\u0631\u062d\u0628\u0627",
             "\U0001F600", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "123", "4.5", "'s", "'ll",
             "don't", "<|im_start|>", "<|im_end|>", "::", "->", "==", "(", ")", "{", "}", ";",
             "\u0928\u092e\u0938\u094d\u0924\u0947", "\u05e9\u05dc\u05d5\u05dd", "e\u0301", "\u00df"]
    seps = [" ", " ", " ", "  ", "\t", "\n", "", ", ", ". ", "\n\n", " \n", "\r\n", "   "]
    out = []
    for _ in range(120):
        n = rng.randint(1, 12)
        s = ""
        for i in range(n):
            if i:
                s += rng.choice(seps)
            s += rng.choice(words)
        out.append(s)
    # random printable-ish code points from a few blocks
    blocks = [(0x20, 0x7e), (0xa0, 0x17f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x5ff),
              (0x600, 0x6ff), (0x900, 0x97f), (0x3040, 0x30ff), (0x4e00, 0x4fff), (0xac00, 0xac80),
              (0x1f300, 0x1f64f), (0x2000, 0x206f), (0x2190, 0x22ff)]
    for _ in range(60):
        n = rng.randint(1, 20)
        s = ""
        for _ in range(n):
            lo, hi = rng.choice(blocks)
            s += chr(rng.randint(lo, hi))
        out.append(s)
    # digits and spaces
    for _ in range(20):
        out.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 12))) for _ in range(rng.randint(1, 5))))
    long_text = (" ".join(handwritten_cases()[:40]) + "\n") * 3
    out.append(long_text)
    out.append("a" * 500)
    out.append(" " * 300 + "end")
    out.append("\U0001F600" * 50)
    out.append("\u4f60\u597d" * 100)
    return out


def corpus():
    rng = random.Random(20240615)
    cases = handwritten_cases() + generated_cases(rng)
    seen, unique = set(), []
    for c in cases:
        if c not in seen:
            seen.add(c)
            unique.append(c)
    return unique


def build_reference(model_path):
    import gguf
    from tokenizers import pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer)

    reader = gguf.GGUFReader(model_path)
    meta = {name: field.contents() for name, field in reader.fields.items()
            if name.startswith("tokenizer.") or name == "general.architecture"}
    tokenizer_dict = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        if "tokenizer." + key in meta:
            tokenizer_dict[name] = meta["tokenizer." + key]
    arch = meta["general.architecture"]
    hf_plain, _ = convert_gguf_tokenizer(arch, tokenizer_dict)
    hf_fixed, _ = convert_gguf_tokenizer(arch, tokenizer_dict)
    pre = tokenizer_dict.get("pre_tokenizer_type")
    if pre == "smollm":
        hf_fixed.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    return hf_plain, hf_fixed


def pretokenizer_reference():
    """HF pre-tokenizers for each tokenizer.ggml.pre family, built from HF's own regex strings."""
    from tokenizers import Regex, pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    gpt2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

    def split(pattern):
        return pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    return {
        "gpt2": split(gpt2),
        "llama-bpe": split(GGUF_PRE_TOKENIZER_SPLITS["llama-bpe"]),
        "qwen2": split(GGUF_PRE_TOKENIZER_SPLITS["qwen2"]),
        "smollm": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), split(gpt2)]),
    }


def piece_ends(pre, text):
    """UTF-8 byte offsets of the end of every piece (pieces are contiguous and cover the text)."""
    ends, pos = [], 0
    for piece, _ in pre.pre_tokenize_str(text):
        pos += len(piece.encode("utf-8"))
        ends.append(pos)
    assert pos == len(text.encode("utf-8")), (text, pos)
    return ends


def encode(tok, text, split_special):
    tok.encode_special_tokens = split_special
    return tok.encode(text, add_special_tokens=False).ids


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODEL
    out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "smollm2_cases.json")
    hf_plain, hf_fixed = build_reference(model)
    cases, num_differ = [], 0
    for text in corpus():
        ids = encode(hf_fixed, text, False)
        ids_plain = encode(hf_fixed, text, True)
        if encode(hf_plain, text, False) != ids:
            num_differ += 1
        # False when the vocabulary cannot spell some byte of the text (those bytes are dropped).
        roundtrip = hf_fixed.decode(ids, skip_special_tokens=False) == text
        if not roundtrip:
            print("note: reference does not round-trip:", repr(text), file=sys.stderr)
        cases.append({"text": text, "ids": ids, "ids_plain": ids_plain, "roundtrip": roundtrip,
                      "decoded": hf_fixed.decode(ids, skip_special_tokens=False)})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"model": os.path.basename(model),
                   "reference": "transformers convert_gguf_tokenizer + smollm digit split",
                   "cases": cases}, f, ensure_ascii=True, indent=0)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {out_path}; {num_differ} differ without the digit split")

    pre_path = os.path.join(os.path.dirname(out_path), "pretokenizer_cases.json")
    refs = pretokenizer_reference()
    texts = corpus()
    with open(pre_path, "w", encoding="utf-8") as f:
        json.dump({"texts": texts,
                   "ends": {name: [piece_ends(pre, t) for t in texts] for name, pre in refs.items()}},
                  f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote pre-tokenizer splits of {len(texts)} texts for {sorted(refs)} to {pre_path}")


if __name__ == "__main__":
    main()
