"""A byte-level BPE tokenizer trained with `tokenizers`, saved so AutoTokenizer loads it offline."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

EOS, BOS, PAD = "<|endoftext|>", "<|bos|>", "<|pad|>"
# The zoo was trained on plain text, so a chat is rendered as a plain `role: content` transcript. Shipped
# as the tokenizer's chat template because SGLang answers /v1/chat/completions with 400 without one.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


# The target is a Qwen2 body, and transformers 5 loads any `model_type: qwen2` tokenizer as its own
# Qwen2Tokenizer, which keeps our vocabulary and merges but imposes Qwen2's normaliser and
# pre-tokeniser. We train with exactly that pipeline, so every loader (AutoTokenizer on the target,
# on the draft, SGLang's) splits text the way the models were trained.
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096):
    """Byte-level BPE: every byte is a token, so any text (and any Python source) encodes."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, BOS, PAD], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def save_tokenizer(tok, path: Path, model_max_length: int = 2048) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   model_max_length=model_max_length, clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))
