"""SGLang's HTTP API, the subset `specdec serve` speaks: requests parsed into Requests, responses
built in SGLang's shapes (0.5.16 field names, which include the 0.5.23 ones).

Everything a client can get wrong becomes BadRequest with a one-line message (HTTP 400).
"""

from __future__ import annotations

import json
import time

from specdec.decoder.engine import Engine, SamplingParams
from specdec.serving.scheduler import Progress, Request

# SGLang's defaults where a request does not say (its SamplingParams and GenerateReqInput).
DEFAULT_MAX_NEW_TOKENS = 128
MAX_STOP_STRINGS = 16

# sampling_params keys SGLang knows that we do not implement: accepted only at their neutral value.
NEUTRAL = {"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
           "min_new_tokens": 0, "n": 1, "skip_special_tokens": True, "spaces_between_special_tokens": True,
           "no_stop_trim": False, "stop_token_ids": None, "json_schema": None, "regex": None, "ebnf": None,
           "logit_bias": None}
SAMPLING_KEYS = {"temperature", "top_p", "top_k", "max_new_tokens", "stop", "ignore_eos", "seed", "sampling_seed"}
GENERATE_KEYS = {"text", "input_ids", "sampling_params", "stream", "rid", "return_spec_trace", "return_logprob",
                 "return_text_in_logprobs", "logprob_start_len", "top_logprobs_num", "stream_options", "lora_path"}
COMPLETION_KEYS = {"model", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "stop",
                   "stream", "stream_options", "seed", "n", "ignore_eos", "logprobs", "echo", "user",
                   "frequency_penalty", "presence_penalty", "return_spec_trace"}
CHAT_KEYS = (COMPLETION_KEYS - {"prompt", "echo"}) | {"messages"}


class BadRequest(Exception):
    """The request cannot be served as it is; the message says why, in one line."""


def parse_json(body: bytes) -> dict:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the request body is not UTF-8") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def _unknown(data: dict, known: set[str], where: str) -> None:
    extra = sorted(set(data) - known)
    if extra:
        raise BadRequest(f"unknown field{'s' if len(extra) > 1 else ''} in {where}: {', '.join(extra)}")


def _number(data: dict, key: str, default, low=None, high=None, integer=False):
    value = data.get(key, default)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise BadRequest(f"{key} must be {'an integer' if integer else 'a number'}, got {json.dumps(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise BadRequest(f"{key} must be in [{low}, {high}], got {value}")
    return value


def _stop_strings(value) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest("stop must be a string or a list of strings")
    if len(stops) > MAX_STOP_STRINGS:
        raise BadRequest(f"at most {MAX_STOP_STRINGS} stop strings")
    return tuple(stops)


def sampling(data: dict, engine: Engine, max_tokens_key: str, defaults: dict) -> tuple[SamplingParams, tuple]:
    """SamplingParams from SGLang-style keys, every value checked."""
    context = engine.max_len
    temperature = _number(data, "temperature", defaults.get("temperature", 1.0), 0.0, 100.0)
    top_p = _number(data, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise BadRequest("top_p must be > 0")
    top_k = _number(data, "top_k", 0, -1, None, integer=True)
    max_new = _number(data, max_tokens_key, defaults.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS), 1, context,
                      integer=True)
    seed = data.get("seed", data.get("sampling_seed"))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise BadRequest(f"seed must be a non-negative integer, got {json.dumps(seed)}")
    ignore_eos = data.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("ignore_eos must be true or false")
    params = SamplingParams(max_new_tokens=max_new, temperature=float(temperature), top_p=float(top_p),
                            top_k=max(0, top_k), stop_at_eos=not ignore_eos, seed=seed)
    return params, _stop_strings(data.get("stop"))


def _neutral_or_fail(data: dict, keys: dict) -> None:
    for key, neutral in keys.items():
        if key in data and data[key] != neutral and data[key] is not None:
            raise BadRequest(f"{key}={json.dumps(data[key])} is not supported by specdec serve")


def _prompt_ids(value, tokenizer, engine: Engine, what: str) -> list[int]:
    if isinstance(value, str):
        if not value:
            raise BadRequest(f"{what} is empty")
        ids = tokenizer(value)["input_ids"]
    elif isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        ids = value
    else:
        raise BadRequest(f"{what} must be a non-empty string or a list of token ids")
    vocab = engine.target.config.vocab_size
    if any(not 0 <= t < vocab for t in ids):
        raise BadRequest(f"token ids must be in 0..{vocab - 1}")
    return ids


def check_fits(request: Request, engine: Engine) -> None:
    try:
        engine.check_prompt(request.prompt_ids, request.params)
    except ValueError as exc:
        raise BadRequest(f"the request does not fit: {exc} (start the server with a larger --context-length)") from None


# -- /generate ------------------------------------------------------------------------------------
def parse_generate(data: dict, tokenizer, engine: Engine) -> tuple[list[Request], bool, bool]:
    """-> (requests, is_batch, stream)."""
    _unknown(data, GENERATE_KEYS, "the request")
    if ("text" in data) == ("input_ids" in data):
        raise BadRequest("give exactly one of text or input_ids")
    sp = data.get("sampling_params")
    sp = {} if sp is None else sp
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params must be an object")
    _unknown(sp, SAMPLING_KEYS | set(NEUTRAL), "sampling_params")
    _neutral_or_fail(sp, NEUTRAL)
    for key in ("return_logprob",):
        if data.get(key):
            raise BadRequest(f"{key} is not supported by specdec serve")
    stream, trace = data.get("stream", False), data.get("return_spec_trace", False)
    if not isinstance(stream, bool) or not isinstance(trace, bool):
        raise BadRequest("stream and return_spec_trace must be true or false")
    params, stops = sampling(sp, engine, "max_new_tokens", {})
    if "text" in data:
        raw, is_batch = data["text"], isinstance(data["text"], list)
        prompts = [_prompt_ids(t, tokenizer, engine, "text") for t in (raw if is_batch else [raw])]
    else:
        raw = data["input_ids"]
        is_batch = isinstance(raw, list) and bool(raw) and isinstance(raw[0], list)
        prompts = [_prompt_ids(t, tokenizer, engine, "input_ids") for t in (raw if is_batch else [raw])]
    if is_batch and (stream or not prompts):
        raise BadRequest("a batch of prompts needs stream false and at least one prompt")
    requests = [Request(p, params, stops, trace, stream=stream) for p in prompts]
    for r in requests:
        check_fits(r, engine)
    return requests, is_batch, stream


def meta_info(request: Request, p: Progress, speculative: bool, k: int) -> dict:
    """SGLang's meta_info; the speculative counters where the server speculates."""
    meta = {"id": request.rid, "finish_reason": p.finish_reason, "prompt_tokens": len(request.prompt_ids),
            "completion_tokens": len(p.output_ids), "cached_tokens": 0}
    if p.finished_at is not None:
        meta["e2e_latency"] = p.finished_at - request.arrived
    if speculative and p.verify_ct > 0:
        correct = sum(p.accepted)
        histogram = [p.accepted.count(n) for n in range(k + 1)]
        proposed = p.verify_ct * k
        meta.update(spec_verify_ct=p.verify_ct, spec_accept_length=len(p.output_ids) / p.verify_ct,
                    spec_accept_rate=correct / proposed, spec_num_correct_drafts=correct,
                    spec_num_proposed_drafts=proposed, spec_correct_drafts_histogram=histogram,
                    # the 0.5.16 aliases of the same three numbers (gone in 0.5.23)
                    spec_accepted_drafts=correct, spec_proposed_drafts=proposed, spec_accept_histogram=histogram)
    if request.trace:
        meta["spec_trace"] = p.trace
    return meta


def generate_response(request: Request, p: Progress, speculative: bool, k: int) -> dict:
    return {"text": p.text, "output_ids": p.output_ids, "meta_info": meta_info(request, p, speculative, k)}


# -- OpenAI-compatible ----------------------------------------------------------------------------
def _openai_common(data: dict, engine: Engine) -> tuple[SamplingParams, tuple, bool, dict, bool]:
    _neutral_or_fail(data, {"n": 1, "logprobs": None, "echo": False, "frequency_penalty": 0.0,
                            "presence_penalty": 0.0})
    stream = data.get("stream", False)
    opts = data.get("stream_options")
    opts = {} if opts is None else opts
    if not isinstance(stream, bool) or not isinstance(opts, dict):
        raise BadRequest("stream must be true or false and stream_options an object")
    _unknown(opts, {"include_usage", "continuous_usage_stats"}, "stream_options")
    trace = data.get("return_spec_trace", False)
    key = "max_completion_tokens" if "max_completion_tokens" in data else "max_tokens"
    params, stops = sampling(data, engine, key, {"max_new_tokens": 16 if key == "max_tokens" else 128})
    return params, stops, stream, {k: bool(v) for k, v in opts.items()}, bool(trace)


def parse_completion(data: dict, tokenizer, engine: Engine) -> tuple[Request, bool, dict]:
    _unknown(data, COMPLETION_KEYS, "the request")
    if "prompt" not in data:
        raise BadRequest("missing prompt")
    params, stops, stream, usage, trace = _openai_common(data, engine)
    prompt = data["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    request = Request(_prompt_ids(prompt, tokenizer, engine, "prompt"), params, stops, trace, stream=stream)
    check_fits(request, engine)
    return request, stream, usage


def chat_prompt(messages, tokenizer) -> str:
    """The prompt the model's chat template renders; a model without one gets 400, as from SGLang."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise BadRequest("each message needs a string role and a string content")
    if not getattr(tokenizer, "chat_template", None):
        raise BadRequest("this model's tokenizer has no chat template: use /v1/completions or /generate")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def parse_chat(data: dict, tokenizer, engine: Engine) -> tuple[Request, bool, dict]:
    _unknown(data, CHAT_KEYS, "the request")
    if "messages" not in data:
        raise BadRequest("missing messages")
    params, stops, stream, usage, trace = _openai_common(data, engine)
    request = Request(_prompt_ids(chat_prompt(data["messages"], tokenizer), tokenizer, engine, "messages"), params,
                      stops, trace, stream=stream)
    check_fits(request, engine)
    return request, stream, usage


def openai_finish(p: Progress) -> tuple[str | None, object]:
    """(finish_reason, matched_stop) in OpenAI's words."""
    if p.finish_reason is None:
        return None, None
    kind = p.finish_reason["type"]
    return ("length" if kind == "length" else "stop" if kind == "stop" else "abort"), p.finish_reason.get("matched")


def usage(request: Request, p: Progress) -> dict:
    n, c = len(request.prompt_ids), len(p.output_ids)
    return {"prompt_tokens": n, "completion_tokens": c, "total_tokens": n + c}


def completion_response(request: Request, p: Progress, model: str, chat: bool) -> dict:
    """The whole answer of a request that did not stream."""
    reason, matched = openai_finish(p)
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": p.text}, "finish_reason": reason,
                  "matched_stop": matched}
    else:
        choice = {"index": 0, "text": p.text, "logprobs": None, "finish_reason": reason, "matched_stop": matched}
    out = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{request.rid}", "object": "chat.completion" if chat else
           "text_completion", "created": int(time.time()), "model": model, "choices": [choice], "usage": usage(request, p)}
    if request.trace:
        out["spec_trace"] = p.trace
    return out


def stream_chunk(request: Request, model: str, chat: bool, delta: str, p: Progress, done: bool = False,
                 first: bool = False, with_usage: bool = False) -> dict:
    """One chunk of a streamed OpenAI answer: new text, the finish reason on the last, and with
    stream_options.continuous_usage_stats the token counts so far."""
    reason, matched = openai_finish(p) if done else (None, None)
    if chat:
        piece = {"role": "assistant", "content": delta} if first else {"content": delta}
        choice = {"index": 0, "delta": piece, "finish_reason": reason, "matched_stop": matched}
    else:
        choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason, "matched_stop": matched}
    out = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{request.rid}",
           "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
           "model": model, "choices": [choice]}
    if with_usage:
        out["usage"] = usage(request, p)
    return out


def usage_chunk(request: Request, p: Progress, model: str, chat: bool) -> dict:
    """The last chunk when stream_options.include_usage: no choices, the token counts."""
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{request.rid}",
            "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [], "usage": usage(request, p)}
