"""A byte-level BPE tokenizer trained with `tokenizers`, saved so AutoTokenizer loads it offline."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

EOS, BOS, PAD = "<|endoftext|>", "<|bos|>", "<|pad|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096):
    """Byte-level BPE: every byte is a token, so any text (and any Python source) encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, BOS, PAD], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def save_tokenizer(tok, path: Path, model_max_length: int = 2048) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   model_max_length=model_max_length, clean_up_tokenization_spaces=False)
    fast.save_pretrained(str(path))


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
