"""Every loader of the zoo's tokenizer splits text the same way the models were trained on.

transformers 5 loads a `model_type: qwen2` tokenizer as its own Qwen2Tokenizer (imposing Qwen2's
normaliser and pre-tokeniser); the draft's loads as TokenizersBackend (tokenizer.json as is).
"""

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from specdec.zoo.corpus import build_corpus


@pytest.fixture(scope="module")
def texts():
    c = build_corpus(max_code_bytes=0)
    return ([d[:2000] for d in c.heldout["code"][:10]] + [d[:2000] for d in c.heldout["open-ended"][:4]]
            + c.heldout["predictable"][:10]
            + ["def f(x):\n    ", "\n\n\n    return x\r\n", "  \t 'é' vs 'e\u0301' 12345 ÆØÅ", "x" * 50])


def test_autotokenizer_on_target_and_draft_and_raw_file_agree(tiny_bundle, texts):
    paths = tiny_bundle.paths
    target = AutoTokenizer.from_pretrained(str(paths["target"]))
    draft = AutoTokenizer.from_pretrained(str(paths["draft"]))
    raw = Tokenizer.from_file(str(paths["target"] / "tokenizer.json"))
    for t in texts:
        ids = raw.encode(t).ids
        assert target(t)["input_ids"] == ids
        assert draft(t)["input_ids"] == ids
        assert tiny_bundle.tokenizer(t)["input_ids"] == ids
        assert target.decode(ids) == raw.decode(ids)


def test_special_tokens_are_set(tiny_bundle):
    tok = tiny_bundle.tokenizer
    assert tok.eos_token == "<|endoftext|>" and tok.bos_token == "<|bos|>" and tok.pad_token == "<|pad|>"
    assert tok.eos_token_id == tiny_bundle.target.config.eos_token_id


def test_the_zoo_tokenizer_is_autotokenizer_without_transformers(tiny_bundle, texts):
    """load_bundle("tiny") reads tokenizer.json with `tokenizers` alone (a faster server start): the same ids,
    the same text back (special tokens kept or skipped), the same chat prompts as AutoTokenizer's."""
    from specdec.zoo.tokenizer import ZooTokenizer

    ours, theirs = tiny_bundle.tokenizer, AutoTokenizer.from_pretrained(str(tiny_bundle.paths["target"]))
    assert isinstance(ours, ZooTokenizer)
    for t in texts:
        ids = theirs(t)["input_ids"]
        assert ours(t)["input_ids"] == ours.encode(t) == ids
        with_specials = [1] + ids + [0, 2]
        for skip in (False, True):
            assert ours.decode(with_specials, skip_special_tokens=skip) == theirs.decode(with_specials, skip_special_tokens=skip)
    assert ours(texts[:3])["input_ids"] == theirs(texts[:3])["input_ids"]
    for name in ("bos_token", "eos_token", "pad_token", "bos_token_id", "eos_token_id", "pad_token_id",
                 "chat_template", "model_max_length"):
        assert getattr(ours, name) == getattr(theirs, name), name
    chats = [[{"role": "user", "content": "hi"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": texts[0]},
              {"role": "assistant", "content": "ok\n"}, {"role": "user", "content": " <|endoftext|> é"}]]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for chat in chats:
        for gen in (False, True):
            want = theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen, tools=tools, x=1)
            assert ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen, tools=tools, x=1) == want
