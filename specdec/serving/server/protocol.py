"""SGLang's HTTP API, the subset `specdec serve` speaks: requests parsed into Jobs (one Request per
answer a client gets back), responses built in SGLang 0.5.16's shapes (field names, order, nulls).

As in SGLang, a field this server does not know is ignored (named once per server in a warning), so
real clients work unchanged. A field SGLang knows and that would change the answer (log-probabilities,
penalties, grammars, ...) gets a one-line 400 saying what SGLang would have done; everything else a
client can get wrong is a one-line 400 too (BadRequest).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from specdec.decoder.params import SamplingParams
from specdec.serving.server.scheduler import Progress, Request
from specdec.serving.server.wire import EngineFacts

log = logging.getLogger("specdec.serve")

# SGLang's defaults where a request does not say.
DEFAULT_MAX_NEW_TOKENS = 128  # /generate (its SamplingParams)
DEFAULT_COMPLETION_TOKENS = 16  # /v1/completions (its CompletionRequest); chat has none: to EOS or the context
MAX_STOP_STRINGS = 16
MAX_JSON_DEPTH = 32  # a request nests 4 or 5 levels; deeper is an attack, refused before anything walks it
MAX_SEQUENCES = 256  # prompts x n in one request: each is a request of its own in the batch
MIN_TOP_P = 1e-6  # the smallest top_p passed on: 1e-50 would round to 0 in float32 (see sampling)
WEIGHT_VERSION = "default"  # SGLang's label of the weights it serves; these never change while serving
DEFAULT_MODEL = "default"  # what SGLang echoes when an OpenAI request names no model

# Fields SGLang knows that change what it returns, which this server does not implement: accepted only at
# their neutral values (None counts as neutral too); otherwise a 400 saying what SGLang would do.
SAMPLING_UNSUPPORTED = {
    "min_p": (0.0, "drops tokens below min_p times the most likely one's probability"),
    "frequency_penalty": (0.0, "penalises tokens by how often they already appeared"),
    "presence_penalty": (0.0, "penalises tokens that already appeared"),
    "repetition_penalty": (1.0, "divides the logits of tokens that already appeared"),
    "min_new_tokens": (0, "suppresses EOS until that many tokens"),
    "json_schema": (None, "constrains decoding to the schema"),
    "regex": (None, "constrains decoding to the regex"),
    "ebnf": (None, "constrains decoding to the grammar"),
    "structural_tag": (None, "constrains decoding to the tag's schema"),
    "stop_token_ids": (None, "also stops at these token ids"),
    "stop_regex": (None, "also stops where the regex matches"),
    "logit_bias": (None, "adds these biases to the logits"),
    "no_stop_trim": (False, "keeps the matched stop string in the text"),
    "skip_special_tokens": (True, "keeps special tokens in the text"),
    "spaces_between_special_tokens": (True, "joins special tokens without spaces"),
    "custom_params": (None, "hands them to a custom logit processor"),
}
OPENAI_UNSUPPORTED = {  # the OpenAI spellings, and fields of the OpenAI requests only
    **{k: v for k, v in SAMPLING_UNSUPPORTED.items() if k != "min_new_tokens"},
    "min_tokens": (0, "suppresses EOS until that many tokens"),
    "response_format": (None, "constrains decoding to the format"),
    "custom_logit_processor": (None, "runs the custom logit processor"),
    "lora_path": (None, "decodes with that LoRA adapter (none is loaded here)"),
    "return_hidden_states": (False, "returns the hidden states"),
    "return_routed_experts": (False, "returns the MoE routing (this model has no experts)"),
}
GENERATE_UNSUPPORTED = {
    "return_logprob": (False, "returns per-token log-probabilities"),
    "top_logprobs_num": (0, "returns the top log-probabilities of each token"),
    "token_ids_logprob": (None, "returns the log-probabilities of these token ids"),
    "return_hidden_states": (False, "returns the hidden states"),
    "return_routed_experts": (False, "returns the MoE routing (this model has no experts)"),
    "return_entropy": (False, "returns each token's entropy"),
    "input_embeds": (None, "decodes from the given embeddings"),
    "image_data": (None, "passes images to a multimodal model (this one reads text)"),
    "video_data": (None, "passes videos to a multimodal model (this one reads text)"),
    "audio_data": (None, "passes audio to a multimodal model (this one reads text)"),
    "lora_path": (None, "decodes with that LoRA adapter (none is loaded here)"),
    "lora_id": (None, "decodes with that LoRA adapter (none is loaded here)"),
    "custom_logit_processor": (None, "runs the custom logit processor"),
}
# Fields SGLang knows that change nothing here (routing, tracing, disaggregation, caching hints): silently ignored.
IGNORED = {"session_id", "session_params", "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key",
           "decode_tp_size", "routed_dp_rank", "data_parallel_rank", "disagg_prefill_dp_rank", "routing_key",
           "conversation_id", "priority", "extra_key", "cache_salt", "custom_labels", "log_metrics", "no_logs",
           "background", "modalities", "routed_experts_start_len", "return_cached_tokens_details", "received_time",
           "external_trace_header", "images_config", "logprob_start_len", "return_text_in_logprobs", "stream_interval",
           "user", "best_of", "suffix", "parallel_tool_calls", "reasoning_effort", "separate_reasoning",
           "stream_reasoning", "max_dynamic_patch", "min_dynamic_patch", "use_audio_in_video", "task",
           "require_reasoning", "return_bytes", "mm_hashes"}
SAMPLING_KEYS = {"temperature", "top_p", "top_k", "max_new_tokens", "stop", "ignore_eos", "seed", "sampling_seed", "n"}
GENERATE_KEYS = {"text", "input_ids", "sampling_params", "stream", "rid", "return_spec_trace"}
OPENAI_KEYS = {"model", "max_tokens", "temperature", "top_p", "top_k", "stop", "stream", "stream_options", "seed", "n",
               "ignore_eos", "rid", "return_spec_trace"}
COMPLETION_KEYS = OPENAI_KEYS | {"prompt", "echo", "logprobs"}
CHAT_KEYS = OPENAI_KEYS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
                           "chat_template_kwargs", "continue_final_message", "return_meta_info",
                           "return_prompt_token_ids"}
CHAT_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


class BadRequest(Exception):
    """The request cannot be served as it is; the message says why, in one line."""


class FieldLog:
    """Names each field the server ignores once (per server, not per request: logs stay readable under load)."""

    def __init__(self, served_models: tuple[str, ...] = ()):
        self.seen: set[tuple[str, str]] = set()
        self.lock = threading.Lock()  # requests may be parsed on worker threads
        self.served_models = {DEFAULT_MODEL, "", *served_models}  # names a request may give without a note

    def model(self, name: str) -> None:
        """A request naming another model than the one served ("gpt-4") is served all the same, as SGLang's
        OpenAI endpoints of the 0.5 line serve it (they echo the name and check nothing); the log says so once."""
        if name in self.served_models:
            return
        with self.lock:
            if ("model", "") in self.seen:
                return
            self.seen.add(("model", ""))
        log.warning("specdec serve: a request names the model %r, but this server serves %s; served all the same, "
                    "as SGLang does (said once)", name[:80], sorted(self.served_models - {DEFAULT_MODEL, ""})[:2])

    def ignore(self, data: dict, known: set[str], where: str) -> None:
        for name in sorted(set(data) - known - IGNORED):
            with self.lock:
                if (where, name) in self.seen:
                    continue
                self.seen.add((where, name))
            log.warning("specdec serve: ignoring the unknown field %r in %s (SGLang ignores unknown fields too)",
                        name[:80], where)


@dataclass
class Job:
    """One HTTP request's work. `requests` in answer order: prompt i's sample j is index i * n + j."""

    requests: list[Request]
    stream: bool
    n: int = 1
    is_batch: bool = False  # /generate: the answer is a list
    chat: bool = False
    model: str = DEFAULT_MODEL  # echoed in OpenAI answers, as SGLang does
    include_usage: bool = False
    continuous_usage: bool = False
    echo: list[str] | None = None  # completions with echo: each prompt's text, put before its answers
    return_meta_info: bool = False
    return_prompt_token_ids: bool = False
    received_ts: float = field(default_factory=time.time)  # the server sets it when the request arrived
    created: int = field(default_factory=lambda: int(time.time()))
    first_sent: dict[int, float] = field(default_factory=dict)  # answer index -> when its first chunk left


def parse_json(body: bytes) -> dict:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the request body is not UTF-8") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise BadRequest("the JSON is nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise BadRequest(f"malformed JSON: {exc}") from None
    if _depth(data) > MAX_JSON_DEPTH:
        raise BadRequest(f"the JSON is nested more than {MAX_JSON_DEPTH} levels deep")
    if not isinstance(data, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def _depth(value, level: int = 0) -> int:
    """How deeply a parsed JSON value nests (iterative: a hostile body cannot blow the stack)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if d > MAX_JSON_DEPTH:
            break
        if isinstance(v, dict):
            todo += [(x, d + 1) for x in v.values()]
        elif isinstance(v, list):
            todo += [(x, d + 1) for x in v]
    return deepest


def _number(data: dict, key: str, default, low=None, high=None, integer=False):
    value = data.get(key, default)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise BadRequest(f"{key} must be {'an integer' if integer else 'a number'}, got {_short(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise BadRequest(f"{key} must be in [{low}, {high}], got {_short(value)}")
    return value


def _short(value, width: int = 40) -> str:
    """A value for a one-line error: a 4,000-digit number is not repeated back in full."""
    text = json.dumps(value)
    return text if len(text) <= width else f"{text[:width]}... ({len(text)} characters)"


def _flag(data: dict, key: str, default: bool = False) -> bool:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{key} must be true or false, got {json.dumps(value)[:40]}")
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


def _unsupported(data: dict, table: dict) -> None:
    """A 400 for a field SGLang would act on and this server cannot, unless it has its neutral value."""
    for key, (neutral, sglang_does) in table.items():
        value = data.get(key)
        if value is None or value == neutral or (neutral is None and value in ([], {}, "")):
            continue
        if key == "response_format" and isinstance(value, dict) and value.get("type") == "text":
            continue
        raise BadRequest(f"{key}={json.dumps(value)[:60]} is not supported by specdec serve (SGLang {sglang_does})")


def sampling(data: dict, engine: EngineFacts, max_tokens_key: str, defaults: dict) -> tuple[SamplingParams, tuple]:
    """SamplingParams from SGLang-style keys, every value checked. A max_new_tokens of None (the default
    given as None, or null in the request) means "to EOS or the context", filled in per prompt by _requests."""
    context = engine.max_len
    temperature = _number(data, "temperature", defaults.get("temperature", 1.0), 0.0, 100.0)
    top_p = _number(data, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise BadRequest("top_p must be > 0")
    top_k = _number(data, "top_k", 0, -1, 2**30, integer=True)  # SGLang's -1 (off) reads 1 << 30 as "no cut"
    max_new = _number(data, max_tokens_key, None, 1, context, integer=True)
    if max_new is None and data.get(max_tokens_key, 0) is not None:  # absent: the endpoint's default
        max_new = defaults.get("max_new_tokens")
    seed = data.get("seed", data.get("sampling_seed"))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64):
        raise BadRequest(f"seed must be an integer in [0, 2**64), got {json.dumps(seed)}")
    ignore_eos = _flag(data, "ignore_eos")
    # a top_p under float32's range rounds to 0 in the engine and keeps no token: any top_p below the top
    # token's mass (at least 1/vocabulary) keeps that token alone, and so does MIN_TOP_P
    params = SamplingParams(max_new_tokens=max_new, temperature=float(temperature), top_p=max(MIN_TOP_P, top_p),
                            top_k=max(0, top_k), stop_at_eos=not ignore_eos, seed=seed)
    return params, _stop_strings(data.get("stop"))


def _choices(data: dict) -> int:
    return _number(data, "n", 1, 1, MAX_SEQUENCES, integer=True)


def _rids(value, prompts: int, n: int) -> list[str]:
    """The client's request ids (SGLang's `rid`: a string, or one per prompt), else fresh ones; the samples
    of one prompt get _0, _1, ... after it."""
    if value is None:
        return [uuid.uuid4().hex for _ in range(prompts * n)]
    ids = [value] if isinstance(value, str) else value
    if not isinstance(ids, list) or not all(isinstance(r, str) and r for r in ids) or len(ids) != prompts:
        raise BadRequest(f"rid must be a string or a list of {prompts} strings (one per prompt)")
    return [r if n == 1 else f"{r}_{j}" for r in ids for j in range(n)]


def _prompt_ids(value, tokenizer, engine: EngineFacts, what: str) -> list[int]:
    if isinstance(value, str):
        if not value:
            raise BadRequest(f"{what} is empty")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"{what} holds a lone surrogate (not valid Unicode text)") from None
        ids = tokenizer(value)["input_ids"]
    elif isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        ids = value
    else:
        raise BadRequest(f"{what} must be a non-empty string or a list of token ids")
    vocab = engine.target.config.vocab_size
    if any(not 0 <= t < vocab for t in ids):
        raise BadRequest(f"token ids must be in 0..{vocab - 1}")
    return ids


def _prompts(value, tokenizer, engine: EngineFacts, what: str) -> tuple[list[list[int]], bool]:
    """One prompt or a batch: a string, token ids, a list of strings, or a list of token-id lists.
    -> (token ids per prompt, is a batch)."""
    batch = isinstance(value, list) and bool(value) and all(isinstance(p, (str, list)) for p in value)
    if isinstance(value, list) and not value:
        raise BadRequest(f"{what} is empty")
    prompts = [_prompt_ids(p, tokenizer, engine, what) for p in (value if batch else [value])]
    return prompts, batch


def room(engine: EngineFacts, prompt_len: int) -> int:
    """The most tokens a prompt leaves room for in this engine's context (its check_prompt's rule)."""
    return engine.max_len - prompt_len - (engine.k + 1 if engine.proposer is not None else 1)


def check_fits(request: Request, engine: EngineFacts) -> None:
    try:
        engine.check_prompt(request.prompt_ids, request.params)
    except ValueError as exc:
        raise BadRequest(f"the request does not fit: {exc} (start the server with a larger --context-length)") from None


def _requests(prompts: list[list[int]], n: int, params: SamplingParams, stops: tuple, trace: bool, stream: bool,
              rid, engine: EngineFacts) -> list[Request]:
    """n Requests per prompt, prompt-major; a budget of None becomes what the context leaves."""
    if len(prompts) * n > MAX_SEQUENCES:
        raise BadRequest(f"{len(prompts)} prompts x n={n} is more than {MAX_SEQUENCES} answers in one request")
    rids = _rids(rid, len(prompts), n)
    out = []
    for i, ids in enumerate(prompts):
        p = params
        if params.max_new_tokens is None:
            left = room(engine, len(ids))
            if left < 1:
                raise BadRequest(f"the prompt ({len(ids)} tokens) leaves no room to generate in this server's context "
                                 f"of {engine.max_len} (start it with a larger --context-length)")
            p = dataclasses.replace(params, max_new_tokens=left)
        for j in range(n):
            request = Request(ids, p, stops, trace, stream=stream, rid=rids[i * n + j])
            check_fits(request, engine)
            out.append(request)
    return out


# -- /generate ------------------------------------------------------------------------------------
def parse_generate(data: dict, tokenizer, engine: EngineFacts, fields: FieldLog | None = None) -> Job:
    fields = fields or FieldLog()
    fields.ignore(data, GENERATE_KEYS | set(GENERATE_UNSUPPORTED), "the request")
    _unsupported(data, GENERATE_UNSUPPORTED)
    if ("text" in data) == ("input_ids" in data):
        raise BadRequest("give exactly one of text or input_ids")
    sp = data.get("sampling_params")
    sp = {} if sp is None else sp
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params must be an object (SGLang's list of one per prompt is not supported)")
    fields.ignore(sp, SAMPLING_KEYS | set(SAMPLING_UNSUPPORTED), "sampling_params")
    _unsupported(sp, SAMPLING_UNSUPPORTED)
    stream, trace = _flag(data, "stream"), _flag(data, "return_spec_trace")
    params, stops = sampling(sp, engine, "max_new_tokens", {"max_new_tokens": DEFAULT_MAX_NEW_TOKENS})
    n = _choices(sp)
    key = "text" if "text" in data else "input_ids"
    raw = data[key]
    if key == "input_ids" and isinstance(raw, list) and raw and not isinstance(raw[0], list):
        prompts, batch = [_prompt_ids(raw, tokenizer, engine, key)], False
    elif key == "text" and isinstance(raw, list) and raw and not all(isinstance(t, str) for t in raw):
        raise BadRequest("text must be a string or a list of strings")
    else:
        prompts, batch = _prompts(raw, tokenizer, engine, key)
    requests = _requests(prompts, n, params, stops, trace, stream, data.get("rid"), engine)
    return Job(requests, stream, n=n, is_batch=batch or n > 1)


def _wall(t_monotonic: float) -> float:
    """A time.monotonic() reading as a Unix timestamp (SGLang's *_ts fields are wall-clock)."""
    return t_monotonic + (time.time() - time.monotonic())


def meta_info(job: Job, index: int, p: Progress, speculative: bool, k: int) -> dict:
    """SGLang's meta_info, in its order. Timings and the speculative counters come with the final answer
    (as in 0.5.16's stream, whose earlier chunks carry only the counts so far)."""
    request = job.requests[index]
    first = index not in job.first_sent
    sent = job.first_sent.setdefault(index, time.time())  # when this answer's first byte left
    admitted = getattr(p, "admitted_at", None)
    meta = {"id": request.rid, "finish_reason": p.finish_reason, "prompt_tokens": len(request.prompt_ids),
            "weight_version": WEIGHT_VERSION, "num_retractions": 0,  # a running request is never preempted here
            "queue_time": max(0.0, admitted - request.arrived) if admitted is not None else 0.0,
            "reasoning_tokens": 0, "completion_tokens": len(p.output_ids),
            "cached_tokens": 0, "cached_tokens_details": None,  # no prefix cache: every prompt token is computed
            "dp_rank": None}
    if p.finished_at is not None:
        finished = _wall(p.finished_at)
        meta["e2e_latency"] = finished - job.received_ts
        if speculative and p.verify_ct > 0:
            correct = sum(p.accepted)
            histogram = [p.accepted.count(a) for a in range(k + 1)]
            proposed = p.drafted or p.verify_ct * k  # verify_ct * k, unless the engine's k is adaptive
            tokens = len(p.output_ids) - p.plain_tokens  # less the tokens of steps without drafts (adaptive k)
            meta.update(spec_accept_rate=correct / proposed, spec_accept_length=tokens / p.verify_ct,
                        spec_num_correct_drafts=correct, spec_num_proposed_drafts=proposed,
                        spec_verify_ct=p.verify_ct,
                        # the 0.5.16 aliases of the same three numbers (gone in 0.5.23)
                        spec_accepted_drafts=correct, spec_proposed_drafts=proposed,
                        spec_correct_drafts_histogram=histogram, spec_accept_histogram=histogram)
        meta.update(request_received_ts=job.received_ts, api_server_dispatch_finish_ts=_wall(request.arrived))
        if job.stream:  # (the order SGLang's stream and its whole answer put them in)
            meta["response_sent_to_client_ts"] = sent
        meta["request_finished_ts"] = finished
        decoding = p.finished_at - p.first_token_at if p.first_token_at is not None else 0.0
        if decoding > 0 and len(p.output_ids) > 1:
            meta["decode_throughput"] = (len(p.output_ids) - 1) / decoding  # tokens/s after the first
    if first or (p.finished_at is not None and not job.stream):  # SGLang stamps the first chunk and the end
        meta["response_sent_to_client_ts"] = sent
    if request.trace:
        meta["spec_trace"] = list(p.trace)  # a streamed event's is a Prefix (scheduler._snapshot)
    return meta


def generate_response(job: Job, index: int, p: Progress, speculative: bool, k: int) -> dict:
    out = {"text": p.text, "output_ids": list(p.output_ids), "meta_info": meta_info(job, index, p, speculative, k)}
    if job.stream and job.is_batch:
        out["index"] = index
    return out


# -- OpenAI-compatible ----------------------------------------------------------------------------
def _openai_common(data: dict, engine: EngineFacts, max_tokens_key: str, default_tokens: int | None,
                   fields: FieldLog, known: set[str]) -> tuple[SamplingParams, tuple, dict]:
    fields.ignore(data, known | set(OPENAI_UNSUPPORTED), "the request")
    _unsupported(data, OPENAI_UNSUPPORTED)
    model = data.get("model", DEFAULT_MODEL)
    if not isinstance(model, str):
        raise BadRequest("model must be a string")
    fields.model(model)
    stream = _flag(data, "stream")
    opts = data.get("stream_options")
    opts = {} if opts is None else opts
    if not isinstance(opts, dict):
        raise BadRequest("stream_options must be an object")
    fields.ignore(opts, {"include_usage", "continuous_usage_stats"}, "stream_options")
    params, stops = sampling(data, engine, max_tokens_key, {"max_new_tokens": default_tokens})
    extra = {"model": model or DEFAULT_MODEL, "stream": stream, "n": _choices(data),
             "include_usage": _flag(opts, "include_usage"), "continuous_usage": _flag(opts, "continuous_usage_stats"),
             "trace": _flag(data, "return_spec_trace")}
    return params, stops, extra


def parse_completion(data: dict, tokenizer, engine: EngineFacts, fields: FieldLog | None = None) -> Job:
    fields = fields or FieldLog()
    if "prompt" not in data:
        raise BadRequest("missing prompt")
    if data.get("max_tokens", 0) is None:
        del data["max_tokens"]  # null: the default, where SGLang's schema (an integer) would refuse it
    params, stops, o = _openai_common(data, engine, "max_tokens", DEFAULT_COMPLETION_TOKENS, fields, COMPLETION_KEYS)
    if data.get("logprobs") is not None:
        raise BadRequest(f"logprobs={json.dumps(data['logprobs'])[:20]} is not supported by specdec serve "
                         "(SGLang returns the top log-probabilities of each token)")
    prompt = data["prompt"]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompts = [_prompt_ids(prompt, tokenizer, engine, "prompt")]  # one prompt of token ids
    else:
        prompts, _ = _prompts(prompt, tokenizer, engine, "prompt")
    echo = None
    if _flag(data, "echo"):  # the prompt as given, token ids decoded
        if isinstance(prompt, str):
            echo = [prompt]
        elif all(isinstance(t, str) for t in prompt):
            echo = list(prompt)
        else:
            echo = [tokenizer.decode(ids, skip_special_tokens=True) for ids in prompts]
    requests = _requests(prompts, o["n"], params, stops, o["trace"], o["stream"], data.get("rid"), engine)
    return Job(requests, o["stream"], n=o["n"], model=o["model"], include_usage=o["include_usage"],
               continuous_usage=o["continuous_usage"], echo=echo)


def _message_text(m: dict, i: int) -> str:
    """A message's content as the text a string-format chat template reads: a string, the text parts of a
    list joined by spaces (SGLang's flattening), or "" for null (an assistant turn that only called tools)."""
    content = m.get("content")
    if content is None:
        if m["role"] == "user":
            raise BadRequest(f"messages[{i}]: a user message needs content")
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"messages[{i}].content must be a string, a list of text parts or null")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "input_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image_url", "input_image", "video_url", "audio_url", "input_audio"):
            raise BadRequest(f"messages[{i}] has a {kind} part: this server's model reads text only "
                             "(SGLang passes those to a multimodal model)")
        else:
            raise BadRequest(f'messages[{i}].content parts must be {{"type": "text", "text": "..."}}')
    return " ".join(texts)


def chat_prompt(messages, tokenizer, tools=None, template_kwargs: dict | None = None) -> str:
    """The prompt the model's chat template renders; a model without one gets 400, as from SGLang."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    rendered = []
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)):
            raise BadRequest("each message needs a string role and a content")
        if m["role"] not in CHAT_ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {', '.join(sorted(CHAT_ROLES))}, "
                             f"got {m['role'][:20]!r}")
        rendered.append({**m, "content": _message_text(m, i)})
    if not getattr(tokenizer, "chat_template", None):
        raise BadRequest("this model's tokenizer has no chat template: use /v1/completions or /generate")
    try:
        return tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True, tools=tools,
                                             **(template_kwargs or {}))
    except Exception as exc:  # a template's own error (raise_exception, a missing key) is the client's to fix
        raise BadRequest(f"the chat template failed on these messages: {str(exc).splitlines()[0][:200]}") from None


def parse_chat(data: dict, tokenizer, engine: EngineFacts, fields: FieldLog | None = None) -> Job:
    fields = fields or FieldLog()
    if "messages" not in data:
        raise BadRequest("missing messages")
    key = "max_completion_tokens" if data.get("max_completion_tokens") is not None else "max_tokens"
    params, stops, o = _openai_common(data, engine, key, None, fields, CHAT_KEYS)  # no budget: to EOS or the context
    if _flag(data, "logprobs") or data.get("top_logprobs"):
        raise BadRequest("logprobs is not supported by specdec serve (SGLang returns each token's log-probability)")
    if _flag(data, "continue_final_message"):
        raise BadRequest("continue_final_message is not supported by specdec serve "
                         "(SGLang continues the last assistant message instead of starting a new one)")
    tools, choice = data.get("tools"), data.get("tool_choice", "auto")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise BadRequest("tools must be a list of objects")
    if tools and choice not in ("auto", "none", None):
        raise BadRequest(f"tool_choice={json.dumps(choice)[:40]} is not supported by specdec serve "
                         "(SGLang constrains decoding to a tool call)")
    kwargs = data.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object")
    text = chat_prompt(data["messages"], tokenizer, tools if tools and choice != "none" else None, kwargs)
    prompts = [_prompt_ids(text, tokenizer, engine, "messages")]
    requests = _requests(prompts, o["n"], params, stops, o["trace"], o["stream"], data.get("rid"), engine)
    return Job(requests, o["stream"], n=o["n"], chat=True, model=o["model"], include_usage=o["include_usage"],
               continuous_usage=o["continuous_usage"], return_meta_info=_flag(data, "return_meta_info"),
               return_prompt_token_ids=_flag(data, "return_prompt_token_ids"))


def openai_finish(p: Progress) -> tuple[str | None, object]:
    """(finish_reason, matched_stop) in OpenAI's words."""
    if p.finish_reason is None:
        return None, None
    kind = p.finish_reason["type"]
    return ("length" if kind == "length" else "stop" if kind == "stop" else "abort"), p.finish_reason.get("matched")


def usage(job: Job, done: dict[int, Progress], exclude_none: bool = False) -> dict:
    """SGLang's usage: completion tokens of every answer, prompt tokens once per prompt (not per sample)."""
    prompt = sum(len(job.requests[i].prompt_ids) for i in done if i % job.n == 0)
    completion = sum(len(p.output_ids) for p in done.values())
    out = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
           "prompt_tokens_details": None, "reasoning_tokens": 0}
    return {k: v for k, v in out.items() if v is not None} if exclude_none else out


def _id(job: Job, index: int = 0) -> str:
    return job.requests[index].rid


def completion_response(job: Job, done: list[Progress], speculative: bool = False, k: int = 0) -> dict:
    """The whole answer of an OpenAI request that did not stream: one choice per Request."""
    choices = []
    for i, p in enumerate(done):
        reason, matched = openai_finish(p)
        if job.chat:
            choice = {"index": i, "message": {"role": "assistant", "content": p.text, "reasoning_content": None,
                                              "tool_calls": None},
                      "logprobs": None, "finish_reason": reason, "matched_stop": matched}
            if job.return_prompt_token_ids:
                choice["prompt_token_ids"] = job.requests[i].prompt_ids
            if job.return_meta_info:
                choice["meta_info"] = meta_info(job, i, p, speculative, k)
        else:
            text = (job.echo[i // job.n] + p.text) if job.echo else p.text
            choice = {"index": i, "text": text, "logprobs": None, "finish_reason": reason, "matched_stop": matched}
        if job.requests[i].trace:
            choice["spec_trace"] = p.trace
        choices.append(choice)
    return {"id": _id(job), "object": "chat.completion" if job.chat else "text_completion", "created": job.created,
            "model": job.model, "choices": choices, "usage": usage(job, dict(enumerate(done))),
            "metadata": {"weight_version": WEIGHT_VERSION}}


def _chunk(job: Job, index: int, choice: dict | None, usage_now: dict | None = None, omit_usage: bool = False) -> dict:
    out = {"id": _id(job, index), "object": "chat.completion.chunk" if job.chat else "text_completion",
           "created": job.created, "model": job.model, "choices": [choice] if choice is not None else []}
    if not omit_usage:
        out["usage"] = usage_now
    return out


def stream_chunks(job: Job, index: int, p: Progress, delta: str, first: bool) -> list[dict]:
    """The chunks SGLang 0.5.16 sends for one progress event of answer `index`.

    Completions: one chunk with the new text (the echo first), the finish reason on the last, usage null
    unless stream_options.continuous_usage_stats. Chat: a first chunk with the role and empty content, then a
    chunk per non-empty piece of text (usage only with continuous_usage_stats); the finish reason comes in a
    chunk of its own at the end (`finish_chunk`)."""
    per_choice = usage(job, {index: p}) if job.continuous_usage else None
    if index % job.n and per_choice is not None:  # SGLang counts each choice's own prompt here
        per_choice.update(prompt_tokens=len(job.requests[index].prompt_ids))
        per_choice["total_tokens"] = per_choice["prompt_tokens"] + per_choice["completion_tokens"]
    if not job.chat:
        reason, matched = openai_finish(p)
        text = (job.echo[index // job.n] + delta) if first and job.echo else delta
        return [_chunk(job, index, {"index": index, "text": text, "logprobs": None, "finish_reason": reason,
                                    "matched_stop": matched}, per_choice)]
    out = []
    if first:
        out.append(_chunk(job, index, {"index": index, "delta": {"reasoning_content": None, "role": "assistant",
                                                                 "content": ""},
                                       "logprobs": None, "finish_reason": None, "matched_stop": None},
                          omit_usage=True))
    if delta:
        out.append(_chunk(job, index, {"index": index, "delta": {"reasoning_content": None, "content": delta},
                                       "logprobs": None, "finish_reason": None, "matched_stop": None},
                          per_choice, omit_usage=per_choice is None))
    return out


def finish_chunk(job: Job, index: int, p: Progress) -> dict:
    """Chat's closing chunk of one answer: an empty delta and the finish reason."""
    reason, matched = openai_finish(p)
    return _chunk(job, index, {"index": index, "delta": {"reasoning_content": None}, "logprobs": None,
                               "finish_reason": reason, "matched_stop": matched}, omit_usage=True)


def usage_chunk(job: Job, done: dict[int, Progress]) -> dict:
    """The last chunk when stream_options.include_usage: no choices, the token counts of every answer
    (completions leave out the null prompt_tokens_details, as SGLang does)."""
    return _chunk(job, max(done), None, usage(job, done, exclude_none=not job.chat))
