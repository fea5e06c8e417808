"""A byte-level BPE tokenizer trained with `tokenizers`, saved so AutoTokenizer loads it offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

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


class ZooTokenizer:
    """The zoo's tokenizer read by `tokenizers` alone, with the part of AutoTokenizer's interface the course
    uses: `tok(text)["input_ids"]`, `decode`, the special tokens, `apply_chat_template`.

    Why not AutoTokenizer: importing transformers takes about 1.5 s of CPU, a third of a `specdec serve` start.
    tokenizer.json already holds the whole pipeline the zoo was trained with, so the ids and the text are
    the same as AutoTokenizer's (tests/test_tokenizer.py compares them). Models from elsewhere still load
    through AutoTokenizer (specdec.decoder.bundle.load_tokenizer).
    """

    def __init__(self, model_dir: Path):
        from tokenizers import Tokenizer

        model_dir = Path(model_dir)
        self.backend = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        self.bos_token, self.eos_token, self.pad_token = config["bos_token"], config["eos_token"], config["pad_token"]
        self.model_max_length = config.get("model_max_length")
        template = model_dir / "chat_template.jinja"
        self.chat_template = template.read_text() if template.is_file() else config.get("chat_template")

    @property
    def bos_token_id(self) -> int:
        return self.backend.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int:
        return self.backend.token_to_id(self.eos_token)

    @property
    def pad_token_id(self) -> int:
        return self.backend.token_to_id(self.pad_token)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def __len__(self) -> int:
        return self.backend.get_vocab_size()

    def __call__(self, text: str | list[str]) -> dict:
        """{"input_ids": ids, "attention_mask": ones}; a list of texts gives a list for each."""
        if isinstance(text, str):
            ids = self.encode(text)
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        ids = [e.ids for e in self.backend.encode_batch(text)]
        return {"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]}

    def encode(self, text: str) -> list[int]:
        # encode_batch, as transformers calls it, even for one text: it releases the GIL while it works and
        # encode does not, so a long prompt tokenized in a server thread would freeze the event loop (/health)
        return self.backend.encode_batch([text])[0].ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.backend.decode([ids] if isinstance(ids, int) else list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, batch, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    def apply_chat_template(self, messages: list[dict], tools=None, add_generation_prompt: bool = False,
                            tokenize: bool = True, **kwargs):
        """The chat template rendered as transformers renders it (a sandboxed Jinja environment, blocks
        trimmed, the special tokens and any extra keyword arguments visible to the template)."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")

        def raise_exception(message):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        text = env.from_string(self.chat_template).render(
            messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
            **{"bos_token": self.bos_token, "eos_token": self.eos_token, "pad_token": self.pad_token, **kwargs})
        return self(text) if tokenize else text  # tokenized: a dict, as transformers 5 returns by default
