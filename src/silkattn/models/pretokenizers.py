"""What a GGUF file's byte-level BPE vocabulary does to a text before its merges: the pre-tokenizer
its tokenizer.ggml.pre names, as llama.cpp's src/llama-vocab.cpp defines each one (the GGUF file's
meaning is llama.cpp's). A pre-tokenizer is a list of regular expressions applied in turn, each
cutting every piece the one before left into its matches and the runs between them (the
`tokenizers` package's Split with behavior "isolated"), and whether a piece found whole in the
vocabulary is taken whole before any merge (ignore_merges: Llama 3's and a few others' rule).

A name that is not in PRE_TOKENIZERS is refused at load, by name: REFUSED gives the reason for
those llama.cpp knows but silkattn does not run."""
from dataclasses import dataclass

# the pieces of the regexes llama.cpp shares between pre-tokenizers
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_SPACES = r"|\s+(?!\S)|\s+"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          + _SPACES)
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
          + _SPACES)
# Tekken's and GPT-4o's as their tokenizer.json writes them (llama.cpp spells the letter classes
# with lookaheads, for a regex engine without \p{Lu}; the same sets)
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_WORDS = rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{{c}}|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{{c}}"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+" + _SPACES
TEKKEN = _WORDS.replace("{c}", "") + r"|\p{N}" + _TAIL
GPT4O = _WORDS.replace("{c}", _CONTRACTIONS + "?") + r"|\p{N}{1,3}" + _TAIL
# the same sets again, as llama.cpp's Granite multilingual embedding entry writes them (marks too)
_GRANITE = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+{c}"
            r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*{c}").replace(
                "{c}", _CONTRACTIONS + "?") + r"|\p{N}{1,3}" + _TAIL
# written with escapes: a copy of the characters could be normalised (NFC) on its way
_DEEPSEEK_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+")
_DEEPSEEK_PUNCTUATION = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_DEEPSEEK3 = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
              r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+" + _SPACES)
_SPARK = _DEEPSEEK3.replace(r"[\r\n]*|\s*[\r\n]+", r"|[\r\n]")
_SCANDINAVIAN = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_YOUTU_CJK = ("[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c"
              "\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|" + _CJK_KANA)
_JAIS2 = (LLAMA3.replace(_SPACES, "")  # runs of spaces cut 512, 256, ... 4 at a time
          + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
          + r"|\s{1,2}(?!\S)|\s{1}")


@dataclass(frozen=True)
class PreTokenizer:
    """regexes: applied in turn (each an isolated Split); ignore_merges: a piece that is a token
    of the vocabulary is that token, before any merge."""
    regexes: tuple
    ignore_merges: bool = False


def _pre(*regexes, ignore_merges=False):
    return PreTokenizer(tuple(regexes), ignore_merges)


_GROUPS = [
    (("default",), _pre(r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano"), _pre(LLAMA3, ignore_merges=True)),
    (("dbrx", "smaug-bpe", "chatglm-bpe"), _pre(LLAMA3)),
    (("glm4", "glm5"), _pre(LLAMA3, ignore_merges=True)),
    (("deepseek-llm",), _pre("[\r\n]", _DEEPSEEK_LETTERS, _DEEPSEEK_PUNCTUATION, r"\s+$", _CJK, r"\p{N}+")),
    (("deepseek-coder",), _pre("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")),
    (("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), _pre(r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3)),
    (("spark2_5",), _pre(r"\p{N}{1,3}", _CJK_KANA, _SPARK, r"\p{N}")),
    (("falcon",), _pre(r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]")),
    (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
     _pre(r"\p{N}", GPT2)),
    (("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
      "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "exaone4",
      "trillion", "granite-docling"), _pre(GPT2)),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open",
      "grok-2"), _pre(QWEN2)),
    (("qwen35",), _pre(QWEN35)),
    (("laguna",), _pre(r"[^\n]+|[\n]+", QWEN2)),
    (("tekken",), _pre(TEKKEN, ignore_merges=True)),
    (("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _pre(GPT4O)),
    (("tiny_aya", "cohere2moe"), _pre(r"\d{1,3}(?=(?:\d{3})*\b)", GPT4O)),
    (("youtu",), _pre(_YOUTU_CJK, GPT4O.replace(r"\p{N}{1,3}", r"\p{N}"), ignore_merges=True)),
    (("granite-embed-multi-97m",), _pre(_GRANITE, ignore_merges=True)),
    (("poro-chat", "bloom", "gpt3-finnish"), _pre(_SCANDINAVIAN)),
    (("viking",), _pre(_SCANDINAVIAN, r"\p{N}")),
    (("seed-coder",), _pre(_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                           r"|\s*[\r\n]+" + _SPACES)),
    (("bailingmoe", "bailingmoe2", "llada-moe"),
     _pre(r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]" + _SPACES)),
    (("ufakzeka",), _pre(r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+" + _SPACES)),
    (("minicpm5",), _pre(r"\p{N}{1,3}", LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}+"), ignore_merges=True)),
    (("exaone-moe",), _pre(_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                           r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]" + _SPACES)),
    (("jais-2",), _pre(_JAIS2)),
    (("chameleon",), _pre("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
                          r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2)),
    (("superbpe",), _pre(r"\p{N}+", r"(?=(\d{3})+(?!\d))")),
]
PRE_TOKENIZERS = {name: pre for names, pre in _GROUPS for name in names}

# names llama.cpp knows that silkattn refuses, and why
REFUSED = {name: why for names, why in [
    (("gemma4", "granite-embed-multi-311m", "sarvam-moe", "whitespace"),
     "its vocabulary is not byte-level (raw UTF-8 pieces)"),
    (("afmoe",), "its digit rule is llama.cpp's own code, not a regular expression"),
    (("kimi-k2",), "llama.cpp splits its texts with code of its own besides its regular expression"),
] for name in names}
