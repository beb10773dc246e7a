"""An OpenAI-compatible server for a GGUF model of the family: python -m silkattn serve --model PATH.

    GET  /health                 {"status": "ok"} (no key asked)
    GET  /v1/models              the one model served, by its file's name (or --name)
    POST /v1/completions         prompt -> text, as model.complete writes it
    POST /v1/chat/completions    messages -> the assistant's answer, as model.chat writes it
    POST /v1/embeddings          input -> sentence embeddings (serve --embedding: a BERT GGUF file)
    GET  /metrics                Prometheus's text format: requests by route and status, tokens in
                                 and out, tokens/s, sequences waiting and running, pages held, the
                                 prompt positions taken from another sequence's keys

Both POSTs take the OpenAI fields model, max_tokens (chat: or max_completion_tokens), temperature,
top_p, seed, stop (a string or up to 4), n (1 to MAX_N answers: the prompt computed once, the
others forks of its pages, answer i drawn with seed + i), stream, stream_options.include_usage, top_k (an
extension), logprobs (chat: true, with top_logprobs 0 to 20; completions: 0 to 5: each token's
log-probability, log_softmax of the logits it was drawn from before temperature, and the top
ones'), and response_format ({"type": "json_object"} or {"type": "json_schema", ...}: the answer
held to the schema while it decodes, models.grammar; the schema compiled off the engine thread within
COMPILE_SECONDS). Chat also takes tools (handed to the chat template, the file's tool_use one where it has
it), chat_template_kwargs (keywords for the template, e.g. {"enable_thinking": false}),
add_generation_prompt (vLLM's field; default true), messages' tool_calls, tool_call_id, name and
reasoning_content, and reasoning_format: "auto" (the default) returns a thinking model's <think>
block apart, as message.reasoning_content (streamed as delta.reasoning_content), "none" leaves it
in the content. Other fields are ignored.
stream: server-sent events, one chunk a piece of text, the last
with its finish_reason, then "data: [DONE]". usage.prompt_tokens_details.cached_tokens: the prompt
tokens whose keys were copied from another sequence whose prompt began alike, running or ended
(models.runner.shares), not computed again. A request the server cannot run never reaches the model:
malformed JSON, a missing or mistyped field, max_tokens < 1, another model's name, a prompt that with
its max_tokens exceeds the context get a 4xx and OpenAI's error body {"error": {"message", "type",
"param", "code"}}; with --api-key, a request without "Authorization: Bearer KEY" gets 401.

One engine thread runs the model: it owns a models.batch.Batch, takes the requests' sequences as
they come, and runs its steps, every live sequence advancing in one pass over the weights; tokens go
back to each request's asyncio queue. A client that goes away (a stream closed, a request's
connection dropped) has its sequence cancelled, its pages freed at the next step. On SIGINT uvicorn
stops accepting, lets running requests finish (at most GRACE seconds, then cancels them) and the
engine stops with the app. Needs the serve extra (uvicorn, starlette).

serve --model FILE --embedding serves a BERT-family GGUF file (models.bert.load) at /v1/embeddings:
input a string, a list of strings, a list of token ids or a list of such lists (at most
MAX_INPUTS, each of at most the model's context); encoding_format "float" (the default) or
"base64" (little-endian float32); each embedding pooled as the file's bert.pooling_type says and
L2-normalised, as llama.cpp's server returns them; a request's inputs batched padding-free as
SentenceEncoder.encode batches them, one request at a time on one worker thread. Completions and
chats sent to such a server, and embeddings asked of a decoder, get a 400 naming the model.
"""
import asyncio
import json
import math
import os
import queue
import threading
import time
import uuid

import numpy as np

from .models import batch as _batch
from .models import reasoning as _reasoning

GRACE = 10  # seconds uvicorn waits on SIGINT for the running requests before cancelling them
POLL = 0.5  # seconds between looks at a non-streaming request's connection (a stream's write fails)
STOPS = 4   # the most stop strings a request may give (OpenAI's limit)
MAX_INPUTS = 2048  # the most inputs an embeddings request may give (OpenAI's limit)
MAX_N = 16  # the most answers one request may ask for (n)
COMPILE_SECONDS = 10  # the most a response_format's schema may take to compile (off the engine thread)


class RequestError(Exception):
    """A request refused before it reaches the model: status, OpenAI's error fields."""

    def __init__(self, status, message, param=None, code=None, kind="invalid_request_error"):
        super().__init__(message)
        self.status, self.body = status, {"error": {"message": message, "type": kind, "param": param,
                                                    "code": code}}


class Engine:
    """The model's one thread: submit() and cancel() from any thread; each sequence's events go to
    its sink (called on the engine thread): ("cached", positions of its prompt whose keys another
    sequence's prefill gave it) before its first token, ("token", id) as each is written, then
    ("done", reason)."""

    def __init__(self, model, max_batch=16, cache_tokens=None):
        self.model = model
        self.batch = _batch.Batch(model, max_batch, cache_tokens=cache_tokens)
        self._inbox, self._sinks = queue.SimpleQueue(), {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="silkattn-engine", daemon=True)
        self._thread.start()

    def submit(self, ids, max_new_tokens, sampling, sink):  # -> a handle for cancel()
        return self.submit_many(ids, max_new_tokens, [sampling], [sink])[0]

    def submit_many(self, ids, max_new_tokens, samplings, sinks):  # -> a handle a sequence, for cancel()
        """n answers to one prompt (n > 1): the later ones forks of the first (Batch.fork: its prompt
        computed once), each with its sampling and its sink."""
        handles = [object() for _ in samplings]
        self._inbox.put(("submit", handles, (ids, max_new_tokens, samplings, sinks)))
        return handles

    def cancel(self, handle):
        self._inbox.put(("cancel", handle, None))

    def stop(self):
        """Cancels what runs or waits (each sink told "cancelled") and ends the thread."""
        self._inbox.put(("stop", None, None))
        self._thread.join()

    def _run(self):
        seqs = {}  # handle -> Sequence
        while True:
            try:  # idle: block for the next request; busy: take what came, then step
                items = [self._inbox.get(timeout=None if self.batch.idle else 0)]
            except queue.Empty:
                items = []
            while True:
                try:
                    items.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for kind, handle, payload in items:
                if kind == "submit":
                    ids, new, samplings, sinks = payload
                    first = None
                    for h, sampling, sink in zip(handle, samplings, sinks):
                        try:  # checked by parse() already; a refusal here ends this request alone
                            seq = self.batch.submit(ids, new, **sampling) if first is None else \
                                self.batch.fork(first, **sampling)
                        except (ValueError, TypeError) as e:
                            sink(("done", f"refused: {e}"))
                            continue
                        first = first or seq
                        seqs[h], self._sinks[seq] = seq, sink
                elif kind == "cancel" and handle in seqs:
                    self.batch.cancel(seqs[handle])
                elif kind == "stop":
                    self._stopping = True
            if self._stopping:
                for seq in list(self._sinks):
                    self.batch.cancel(seq)
            else:
                try:
                    written = self.batch.step() if not self.batch.idle else ()
                except Exception as e:  # a fault of silkattn's: these requests fail, the server goes on
                    written = ()
                    for seq in list(self._sinks):
                        self.batch.cancel(seq)
                        seq.finish_reason = f"failed: {type(e).__name__}: {e}"
                for seq, token in written:
                    if len(seq.new) == 1:  # its first token: the prompt's positions taken from another's
                        self._sinks[seq](("cached", seq.shared))
                    if seq.logprobs is not None:  # (its log-probability, the top ones) before the token
                        self._sinks[seq](("logprob", seq.token_logprobs[-1]))
                    self._sinks[seq](("token", token))
            for handle, seq in list(seqs.items()):
                if seq.done:
                    self._sinks.pop(seq)(("done", seq.finish_reason))
                    del seqs[handle]
            if self._stopping:
                return


class _Text:
    """A sequence's text as its tokens come: pieces whose characters are whole, the closing EOS
    writing nothing, held back while it could still be the start of a stop string."""

    def __init__(self, model, stops):
        self.model, self.decoder, self.stops = model, model.tokenizer.stream(), stops
        self.ids, self.text, self.sent, self.stopped = [], "", 0, False

    def add(self, token):  # -> the text now safe to send
        if self.stopped or token == self.model.eos_id:
            return ""
        self.ids.append(int(token))
        self.text += self.decoder.step(int(token)) or ""
        return self._ready(final=False)

    def finish(self, reason):  # -> the rest of the text
        if not self.stopped and self.ids:
            whole = self.model.tokenizer.decode(self.ids, skip_special_tokens=False)
            if whole.startswith(self.text):
                self.text = whole
        return self._ready(final=True)

    def _ready(self, final):
        cut = min((self.text.find(s) for s in self.stops if s in self.text), default=-1)
        if cut >= 0:
            self.text, self.stopped = self.text[:cut], True
        hold = 0 if final or self.stopped else max((len(s) - 1 for s in self.stops), default=0)
        end = max(self.sent, len(self.text) - hold)
        piece, self.sent = self.text[self.sent:end], end
        return piece


def _field(body, name, types, default=None, check=None, message=None):
    """body[name] if of one of `types` (bool is not a number) and passing check, else a 400."""
    if name not in body or body[name] is None:
        return default
    value = body[name]
    numeric = any(t in (int, float) for t in types)
    if not isinstance(value, types) or (numeric and isinstance(value, bool)):
        kinds = " or ".join(t.__name__ for t in types)
        raise RequestError(400, f"'{name}' must be of type {kinds}, got {type(value).__name__}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestError(400, f"'{name}' must be a finite number", name)
    if check is not None and not check(value):
        raise RequestError(400, message or f"'{name}' is out of range: {value!r}", name)
    return value


def _stops(body):
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > STOPS:
        raise RequestError(400, f"'stop' must be a non-empty string or a list of at most {STOPS} of them",
                           "stop")
    return stops


def _model_named(body, name):  # a RequestError unless the body's model is this server's
    requested = body.get("model")
    if not isinstance(requested, str):
        raise RequestError(400, "'model' is required: a string naming the model", "model")
    if requested != name:
        raise RequestError(404, f"The model '{requested}' does not exist; this server has '{name}'", "model",
                           "model_not_found")


def response_schema(body):  # -> the JSON schema the answer is held to, or None
    """response_format: absent or {"type": "text"}: none; {"type": "json_object"}: any JSON object;
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}: that schema."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    spec = fmt.get("json_schema") if kind == "json_schema" else None
    if isinstance(spec, dict) and isinstance(spec.get("schema", {}), dict):
        return spec.get("schema", {})
    raise RequestError(400, "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                       "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}",
                       "response_format")


def parse(body, model, name, chat):
    """(prompt ids, max_tokens, sampling, stops, stream, include_usage) of a request's JSON body, or
    a RequestError: everything checked here, before the model sees it."""
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    _model_named(body, name)
    thinking = None
    if chat:
        messages, tools = _messages(body), _tools(body)
        kwargs = _field(body, "chat_template_kwargs", (dict,), {})
        reasoning_format = _field(body, "reasoning_format", (str,), "auto", lambda v: v in _reasoning.FORMATS,
                                  f"'reasoning_format' must be one of {', '.join(_reasoning.FORMATS)}")
        generation = _field(body, "add_generation_prompt", (bool,), True)
        try:
            text = model.apply_chat_template(messages, generation, tools=tools, **kwargs)
        except (TypeError, ValueError) as e:
            raise RequestError(400, str(e), "messages") from None
        thinking = model.reasoning_start(text, tools, reasoning_format)
        where = "messages"
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise RequestError(400, "'prompt' is required: a string (or a list of one)", "prompt")
        text, where = prompt, "prompt"
    n = _field(body, "n", (int,), 1, lambda v: 1 <= v <= MAX_N, f"'n' must be in [1, {MAX_N}]")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    new = _field(body, key, (int,), None if chat else 16, lambda v: v >= 1, f"'{key}' must be at least 1")
    sampling = {"temperature": float(_field(body, "temperature", (int, float), 1.0,
                                            lambda v: 0 <= v <= 2, "'temperature' must be in [0, 2]")),
                "top_p": _field(body, "top_p", (int, float), None, lambda v: 0 < v <= 1,
                                "'top_p' must be in (0, 1]"),
                "top_k": _field(body, "top_k", (int,), None, lambda v: v >= 1, "'top_k' must be at least 1"),
                "seed": _field(body, "seed", (int,), None, lambda v: v >= 0, "'seed' must be non-negative")}
    sampling.update(_logprob_fields(body, chat))
    stream = _field(body, "stream", (bool,), False)
    options = _field(body, "stream_options", (dict,), {})
    ids = model.prompt_ids(text)
    context = model.config.context_length
    if not ids:
        raise RequestError(400, f"the {where} holds no token", where)
    if new is None:
        new = context - len(ids)
    if len(ids) + new > context:
        raise RequestError(400, f"This model's maximum context length is {context} tokens; the {where} holds "
                           f"{len(ids)} and {new} more were asked", where, "context_length_exceeded")
    if any(t >= model.config.vocab for t in ids):
        raise RequestError(400, f"the {where} has a token outside the vocabulary", where)
    return ids, new, sampling, _stops(body), stream, bool(options.get("include_usage", False)), thinking, n


def _logprob_fields(body, chat):  # -> {"logprobs": how many top ones} where asked, else {}
    """Chat: logprobs (bool) and top_logprobs (0 to 20, with logprobs); completions: logprobs (0 to 5)."""
    if chat:
        top = _field(body, "top_logprobs", (int,), None, lambda v: 0 <= v <= 20,
                     "'top_logprobs' must be in [0, 20]")
        if not _field(body, "logprobs", (bool,), False):
            if top is not None:
                raise RequestError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
            return {}
        return {"logprobs": top or 0}
    n = _field(body, "logprobs", (int,), None, lambda v: 0 <= v <= 5, "'logprobs' must be in [0, 5]")
    return {} if n is None else {"logprobs": n}


ROLES = ("system", "developer", "user", "assistant", "tool")


def _messages(body):
    """The request's messages as the chat template takes them: content parts of type text joined
    into one string (no other kind is served), a tool call's arguments (OpenAI sends a JSON string)
    decoded into the object templates expect; anything malformed a 400 naming where."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' is required: a non-empty list of {role, content}", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(400, f"{where} must be an object with a role of {', '.join(ROLES)}", where)
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(400, f"{where}.content: only parts of type text are served", where)
            content = "".join(p["text"] for p in content)
        elif content is not None and not isinstance(content, str):
            raise RequestError(400, f"{where}.content must be a string, a list of text parts or null", where)
        if content is None and not m.get("tool_calls"):
            raise RequestError(400, f"{where} has no content", where)
        m = {**m, "content": content}
        if m.get("tool_calls") is not None:
            m["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
        for key in ("name", "tool_call_id", "reasoning_content"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise RequestError(400, f"{where}.{key} must be a string", where)
        out.append(m)
    return out


def _tool_calls(calls, where):
    if not isinstance(calls, list):
        raise RequestError(400, f"{where} must be a list", where)
    out = []
    for j, call in enumerate(calls):
        f = call.get("function") if isinstance(call, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise RequestError(400, f"{where}[{j}] must be an object with a function {{name, arguments}}",
                               where)
        arguments = f.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                raise RequestError(400, f"{where}[{j}].function.arguments is not valid JSON", where) from None
        out.append({**call, "function": {**f, "arguments": arguments}})
    return out


def _tools(body):
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools):
        raise RequestError(400, "'tools' must be a list of {\"type\": \"function\", "
                           "\"function\": {name, ...}}", "tools")
    return tools or None


class _Server:
    """The app's handlers over one model and its engine (made in the app's lifespan)."""

    def __init__(self, model, name, api_key):
        self.model, self.name, self.api_key, self.engine = model, name, api_key, None
        self.grammars = None  # _Grammars, made when a request first asks for a response_format

    def vocabulary(self):  # -> each token's bytes (grammar.vocabulary: read once, shared with the grammars)
        from .models import grammar
        return grammar.vocabulary(self.model)

    async def constrained(self, body, samplings):  # -> samplings, each with its own response_format matcher
        schema = response_schema(body)
        if schema is None:
            return samplings
        if self.grammars is None:
            self.grammars = _Grammars(self.model)
        constraints = await self.grammars.constraints(schema, len(samplings))
        return [dict(s, constraint=c) for s, c in zip(samplings, constraints)]

    @staticmethod
    def error(e):
        from starlette.responses import JSONResponse
        return JSONResponse(e.body, status_code=e.status)

    def authorize(self, request):
        if self.api_key is not None and request.headers.get("authorization", "") != f"Bearer {self.api_key}":
            raise RequestError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                               None, "invalid_api_key", "authentication_error")

    async def health(self, request):
        from starlette.responses import JSONResponse
        return JSONResponse({"status": "ok"})

    async def models(self, request):
        from starlette.responses import JSONResponse
        try:
            self.authorize(request)
        except RequestError as e:
            return self.error(e)
        return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model", "created": 0,
                                                          "owned_by": "silkattn"}]})

    async def completions(self, request):
        return await self.completion(request, chat=False)

    async def chat_completions(self, request):
        return await self.completion(request, chat=True)

    async def completion(self, request, chat):
        try:
            self.authorize(request)
            try:
                body = json.loads(await request.body())
            except ValueError:
                raise RequestError(400, "the body is not valid JSON") from None
            ids, new, sampling, stops, stream, include_usage, thinking, n = parse(body, self.model, self.name,
                                                                                  chat)
            samplings = [dict(sampling, seed=None if sampling["seed"] is None else sampling["seed"] + i)
                         for i in range(n)]  # each answer its own draws
            samplings = await self.constrained(body, samplings)
        except RequestError as e:
            return self.error(e)
        loop, queues = asyncio.get_running_loop(), [asyncio.Queue() for _ in range(n)]
        handles = self.engine.submit_many(ids, new, samplings, [
            lambda ev, q=q: loop.call_soon_threadsafe(q.put_nowait, ev) for q in queues])
        replies = [_Reply(self, chat, h, q, _Text(self.model, stops), len(ids), thinking, index=i)
                   for i, (h, q) in enumerate(zip(handles, queues))]
        return _streamed(replies, include_usage) if stream else await _whole(replies, request)


class _Counted:
    """ASGI middleware: each response counted by its route and status (for /metrics)."""

    def __init__(self, app, counts):
        self.app, self.counts = app, counts

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def sending(message):
            if message["type"] == "http.response.start":
                key = (scope["path"], message["status"])
                self.counts[key] = self.counts.get(key, 0) + 1
            await send(message)
        await self.app(scope, receive, sending)


def metrics_text(counts, gauges):
    """Prometheus's text exposition: counts {(route, status): n} as silkattn_requests_total, and
    gauges [(name, kind, help, value)]."""
    lines = ["# HELP silkattn_requests_total Responses sent, by route and status.",
             "# TYPE silkattn_requests_total counter"]
    lines += [f'silkattn_requests_total{{route="{route}",status="{status}"}} {n}'
              for (route, status), n in sorted(counts.items())]
    for name, kind, text, value in gauges:
        lines += [f"# HELP silkattn_{name} {text}", f"# TYPE silkattn_{name} {kind}",
                  f"silkattn_{name} {value:g}"]
    return "\n".join(lines) + "\n"


def _engine_gauges(batch):
    s, pool = batch.stats, batch.pool
    return [("prompt_tokens_total", "counter",
             "Prompt tokens prefilled or taken from another sequence's keys.", s["prompt_tokens"]),
            ("generation_tokens_total", "counter", "Tokens written.", s["new_tokens"]),
            ("prompt_tokens_shared_total", "counter", "Prompt positions whose keys were copied from another "
             "sequence's (the prefix reuse).", s["shared_tokens"]),
            ("prefix_reuse_ratio", "gauge", "prompt_tokens_shared_total over prompt_tokens_total.",
             s["shared_tokens"] / max(1, s["prompt_tokens"])),
            ("decode_tokens_per_second", "gauge",
             "Decoding steps' tokens over their seconds, since the start.",
             s["batch_rows"] / s["decode_s"] if s["decode_s"] else 0.0),
            ("sequences_waiting", "gauge", "Sequences waiting to join the batch.", len(batch.waiting)),
            ("sequences_running", "gauge", "Sequences in the batch.", len(batch.running)),
            ("kv_pages_total", "gauge", "Pages of the KV cache.", pool.pages),
            ("kv_pages_taken", "gauge", "Pages held by running sequences.", pool.taken),
            ("kv_pages_kept", "gauge", "Pages of ended prompts kept for later ones.", pool.kept_pages)]


class _Grammars:
    """response_format's schemas compiled to a sequence's grammar.Constraint on a thread of their
    own, each within COMPILE_SECONDS, so that one client's schema never stalls the engine's steps."""

    def __init__(self, model):
        import concurrent.futures
        self.model = model
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="silkattn-grammar")

    def make(self, schema, n):
        from .models import grammar
        compiled = grammar.compile_schema(self.model, schema)
        return [grammar.Constraint(self.model, compiled) for _ in range(n)]

    async def constraints(self, schema, n):  # -> n grammar.Constraints, or a RequestError naming the schema
        try:
            work = asyncio.get_running_loop().run_in_executor(self.pool, self.make, schema, n)
            return await asyncio.wait_for(work, COMPILE_SECONDS)
        except ImportError:
            raise RequestError(400, "response_format needs llguidance: pip install llguidance",
                               "response_format") from None
        except ValueError as e:
            raise RequestError(400, f"response_format: {e}", "response_format") from None
        except asyncio.TimeoutError:
            raise RequestError(400, f"response_format: the schema took over {COMPILE_SECONDS} s to compile",
                               "response_format") from None


class _Reply:
    """One request's answer as the engine's events come: streamed chunks, or the whole of it."""

    def __init__(self, server, chat, handle, events, text, prompt_tokens, thinking=None, index=0):
        self.server, self.chat, self.handle, self.events, self.text = server, chat, handle, events, text
        self.index = index  # the choice it is (n > 1)
        # thinking: None, the reply not split; else whether it begins inside the prompt's <think>
        self.thinking = thinking
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created, self.kind = int(time.time()), "chat.completion" if chat else "text_completion"
        self.usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens,
                      "prompt_tokens_details": {"cached_tokens": 0}}
        # entries: [(token, logprob, top)] not yet sent (None: not asked); offset: completions' text_offset
        self.logprob, self.entries, self.offset = None, None, 0

    async def pieces(self):  # -> (piece of text, finish_reason or None) as the tokens come
        reason = None
        try:
            while reason is None:
                what, value = await self.events.get()
                if what == "cached":  # OpenAI's field for the prompt tokens served from a cache
                    self.usage["prompt_tokens_details"] = {"cached_tokens": value}
                elif what == "logprob":
                    self.logprob, self.entries = value, self.entries if self.entries is not None else []
                elif what == "token":
                    self.usage["completion_tokens"] += 1
                    eos = value == self.server.model.eos_id
                    if self.logprob is not None and not self.text.stopped and not eos:
                        self.entries.append((value, *self.logprob))
                    piece = self.text.add(value)
                    if self.text.stopped:
                        self.server.engine.cancel(self.handle)
                    if piece:
                        yield piece, None
                elif value.startswith("refused: "):
                    raise RequestError(400, value[len("refused: "):])
                elif value.startswith("failed: "):
                    raise RequestError(500, value[len("failed: "):], kind="server_error")
                else:
                    reason = "stop" if self.text.stopped or value == "stop" else "length"
            self.usage["total_tokens"] = self.usage["prompt_tokens"] + self.usage["completion_tokens"]
            yield self.text.finish(reason), reason
        finally:
            if reason is None:  # the client went away: free its slot at the next step
                self.server.engine.cancel(self.handle)

    def chunk(self, piece, reason, first=False, field="content"):
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {field: piece} if piece else {}
            choice = {"index": self.index, "delta": delta, "finish_reason": reason,
                      "logprobs": self.take_logprobs()}
        else:
            choice = {"index": self.index, "text": piece, "finish_reason": reason,
                      "logprobs": self.take_logprobs()}
        return {"id": self.id, "object": self.kind + ".chunk" if self.chat else self.kind,
                "created": self.created, "model": self.server.name, "choices": [choice]}

    def take_logprobs(self):  # -> OpenAI's logprobs of the tokens not yet sent, or None
        if self.entries is None:
            return None
        entries, self.entries = self.entries, []
        vocabulary = self.server.vocabulary()

        def text(t):
            return vocabulary[t].removeprefix(b"\xff")
        if self.chat:
            def item(t, lp):
                return {"token": text(t).decode("utf-8", "replace"), "logprob": lp, "bytes": list(text(t))}
            return {"content": [dict(item(t, lp), top_logprobs=[item(i, x) for i, x in top])
                                for t, lp, top in entries]}
        tokens = [text(t).decode("utf-8", "replace") for t, _, _ in entries]
        offsets = list(np.cumsum([0] + [len(t) for t in tokens])[:-1] + self.offset)
        self.offset += sum(map(len, tokens))
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [{text(i).decode("utf-8", "replace"): x for i, x in top}
                                 for _, _, top in entries],
                "text_offset": [int(o) for o in offsets]}

    async def chunks(self):  # -> the stream's chunks (dicts) as the tokens come; an error's body as one
        if self.chat:
            yield self.chunk("", None, first=True)
        try:
            splitter = None if self.thinking is None else _reasoning.Splitter(self.thinking)
            async for piece, reason in self.pieces():
                if splitter is not None:  # the reasoning's pieces and the answer's, apart
                    for field, part in splitter.feed(piece) + (splitter.finish() if reason else []):
                        yield self.chunk(part, None, field=field)
                    piece = ""
                if piece or reason:
                    yield self.chunk(piece, reason)
        except RequestError as e:  # OpenAI's streams carry an error as an event
            yield e.body

    async def result(self, request):  # -> (status, the choice or an error's body)
        gen, parts, reason = self.pieces(), [], None
        checked = time.monotonic()
        try:
            while reason is None:  # the connection looked at every POLL seconds while the tokens come
                step = asyncio.ensure_future(gen.__anext__())
                while not step.done():
                    await asyncio.wait({step}, timeout=POLL)
                    if time.monotonic() - checked >= POLL:
                        checked = time.monotonic()
                        if await request.is_disconnected():
                            step.cancel()
                            return 499, {}
                piece, reason = step.result()
                parts.append(piece)
        except RequestError as e:
            return e.status, e.body
        finally:
            await gen.aclose()
        content = "".join(parts)
        message = {"role": "assistant", "content": content}
        if self.thinking is not None:
            reply = _reasoning.split(content, self.thinking)
            message["content"] = str(reply)
            if reply.reasoning_content is not None:
                message["reasoning_content"] = reply.reasoning_content
        logprobs = self.take_logprobs()
        return 200, ({"index": self.index, "message": message, "finish_reason": reason,
                      "logprobs": logprobs} if self.chat else
                     {"index": self.index, "text": content, "finish_reason": reason, "logprobs": logprobs})


def _usage(replies):  # the answers' usage together: the prompt once, every answer's tokens
    usage = dict(replies[0].usage)
    usage["completion_tokens"] = sum(r.usage["completion_tokens"] for r in replies)
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


async def _whole(replies, request):  # -> the JSON answer of one request's replies (its n choices)
    from starlette.responses import JSONResponse
    results = await asyncio.gather(*(r.result(request) for r in replies))
    for status, body in results:
        if status != 200:
            for r in replies:  # one answer failed: the others are not waited for
                r.server.engine.cancel(r.handle)
            return JSONResponse(body, status_code=status)
    first = replies[0]
    return JSONResponse({"id": first.id, "object": first.kind, "created": first.created,
                         "model": first.server.name, "choices": [body for _, body in results],
                         "usage": _usage(replies)})


def _streamed(replies, include_usage):  # -> the server-sent events of one request's replies
    from starlette.responses import StreamingResponse

    async def sse():
        queue, live = asyncio.Queue(), len(replies)

        async def pump(reply):
            try:
                async for chunk in reply.chunks():
                    await queue.put(chunk)
            finally:
                await queue.put(None)
        tasks = [asyncio.ensure_future(pump(r)) for r in replies]
        try:
            while live:
                chunk = await queue.get()
                if chunk is None:
                    live -= 1
                else:
                    yield f"data: {json.dumps(chunk)}\n\n"
            if include_usage:
                tail = dict(replies[0].chunk("", None), choices=[], usage=_usage(replies))
                yield f"data: {json.dumps(tail)}\n\n"
            yield "data: [DONE]\n\n"
        finally:  # the client went away: each answer's pieces() cancels its sequence
            for task in tasks:
                task.cancel()
    return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def embedding_inputs(body, encoder, name):  # -> ([int64 arrays of token ids], base64: bool)
    """The token ids of an embeddings request's inputs (strings tokenized as encoder.tokenize does:
    [CLS] ... [SEP]; token ids taken as given), or a RequestError naming what is wrong."""
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    _model_named(body, name)
    fmt = _field(body, "encoding_format", (str,), "float", lambda v: v in ("float", "base64"),
                 "'encoding_format' must be 'float' or 'base64'")
    c = encoder.config
    _field(body, "dimensions", (int,), c.d, lambda v: v == c.d, f"'dimensions' must be {c.d}, the model's")
    given = body.get("input")
    if isinstance(given, str) or (isinstance(given, list) and given and all(
            isinstance(t, int) and not isinstance(t, bool) for t in given)):
        given = [given]
    if not isinstance(given, list) or not given or len(given) > MAX_INPUTS:
        raise RequestError(400, f"'input' must be a string, a list of 1 to {MAX_INPUTS} strings, a list of "
                           "token ids or a list of such lists", "input")
    texts = [i for i, x in enumerate(given) if isinstance(x, str)]
    try:
        tokens = encoder.tokenize([given[i] for i in texts], truncate=False) if texts else []
    except ValueError as e:  # "sentence j holds more than n tokens": input texts[j]
        j, rest = str(e).split(" ", 2)[1:]
        raise RequestError(400, f"input[{texts[int(j)]}] {rest}; this model embeds at most "
                           f"{c.max_seq_length}", "input", "context_length_exceeded") from None
    out = [None] * len(given)
    for i, ids in zip(texts, tokens):
        out[i] = ids
    for i, x in enumerate(given):
        if out[i] is None:
            if not isinstance(x, list) or not x or not all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t < c.vocab for t in x):
                raise RequestError(400, f"input[{i}] must be a string or a non-empty list of token ids in "
                                   f"[0, {c.vocab})", "input")
            out[i] = np.asarray(x, np.int64)
        if len(out[i]) > c.max_seq_length:
            raise RequestError(400, f"input[{i}] holds {len(out[i])} tokens; this model embeds at most "
                               f"{c.max_seq_length}", "input", "context_length_exceeded")
    return out, fmt == "base64"


class _Embedder:
    """The /v1/embeddings handler over a SentenceEncoder: one request's inputs encoded at a time on
    one worker thread (the kernels' own threads do the work; the event loop stays free)."""

    def __init__(self, server, encoder):
        import concurrent.futures
        self.server, self.encoder = server, encoder
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="silkattn-embed")
        self.inputs = self.tokens = 0  # embedded so far (/metrics)

    async def embeddings(self, request):
        import base64

        from starlette.responses import JSONResponse
        try:
            self.server.authorize(request)
            try:
                body = json.loads(await request.body())
            except ValueError:
                raise RequestError(400, "the body is not valid JSON") from None
            tokens, b64 = embedding_inputs(body, self.encoder, self.server.name)
        except RequestError as e:
            return self.server.error(e)
        E = await asyncio.get_running_loop().run_in_executor(self.pool, self.encoder.encode_tokens, tokens)
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(e.astype("<f4").tobytes()).decode() if b64 else e.tolist()}
                for i, e in enumerate(E)]
        n = int(sum(len(t) for t in tokens))
        self.inputs, self.tokens = self.inputs + len(tokens), self.tokens + n
        return JSONResponse({"object": "list", "data": data, "model": self.server.name,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})


def create_app(model, name, *, max_batch=16, api_key=None, cache_tokens=None):
    """The Starlette app serving `model` as `name`: a decoder (a models.load result) at the
    completions, or a sentence encoder (models.bert.load) at /v1/embeddings."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    from .models import bert
    server, state = _Server(model, name, api_key), {}
    if isinstance(model, bert.SentenceEncoder):
        return _embedding_app(server, model, state)

    @asynccontextmanager
    async def lifespan(app):
        server.engine = state["engine"] = Engine(model, max_batch, cache_tokens)
        try:
            yield
        finally:
            server.engine.stop()
            if server.grammars is not None:
                server.grammars.pool.shutdown(wait=False, cancel_futures=True)

    async def metrics(request):
        from starlette.responses import PlainTextResponse
        try:
            server.authorize(request)
        except RequestError as e:
            return server.error(e)
        gauges = _engine_gauges(server.engine.batch) if server.engine is not None else []
        return PlainTextResponse(metrics_text(counts, gauges), media_type="text/plain; version=0.0.4")

    def cannot_embed(request):
        return _refused(f"the model '{name}' is a decoder and does not embed: serve an embedding model "
                        "(serve --model FILE --embedding)", "model")

    routes = [Route("/health", server.health), Route("/v1/models", server.models),
              Route("/v1/completions", server.completions, methods=["POST"]),
              Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
              Route("/v1/embeddings", cannot_embed, methods=["POST"]), Route("/metrics", metrics)]
    counts = state["counts"] = {}
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(_Counted, counts=counts)])
    app.state.silkattn = state  # the engine, for tests and tools
    return app


def _refused(message, param):
    from starlette.responses import JSONResponse
    error = RequestError(400, message, param)
    return JSONResponse(error.body, status_code=error.status)


def _embedding_app(server, encoder, state):
    """The app of an embedding model: /health, /v1/models, /v1/embeddings; completions refused."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    embedder = state["embedder"] = _Embedder(server, encoder)

    @asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            embedder.pool.shutdown(wait=True, cancel_futures=True)

    def cannot_complete(request):
        return _refused(f"the model '{server.name}' is an embedding model: it answers /v1/embeddings only",
                        "model")

    async def metrics(request):
        from starlette.responses import PlainTextResponse
        try:
            server.authorize(request)
        except RequestError as e:
            return server.error(e)
        gauges = [("embedded_inputs_total", "counter", "Inputs embedded.", embedder.inputs),
                  ("embedded_tokens_total", "counter", "Tokens embedded.", embedder.tokens)]
        return PlainTextResponse(metrics_text(counts, gauges), media_type="text/plain; version=0.0.4")

    routes = [Route("/health", server.health), Route("/v1/models", server.models),
              Route("/v1/embeddings", embedder.embeddings, methods=["POST"]),
              Route("/v1/completions", cannot_complete, methods=["POST"]),
              Route("/v1/chat/completions", cannot_complete, methods=["POST"]), Route("/metrics", metrics)]
    counts = state["counts"] = {}
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(_Counted, counts=counts)])
    app.state.silkattn = state
    return app


def main(args):
    """python -m silkattn serve: the model's file loaded, then uvicorn on --host:--port."""
    try:
        import uvicorn
    except ImportError:
        raise SystemExit('serving needs the serve extra: pip install "silkattn[serve]"') from None
    import silkattn
    from silkattn.models import llama
    if args.threads:
        silkattn.set_num_threads(args.threads)
    if getattr(args, "embedding", False):
        from silkattn.models import bert
        if not args.model:
            raise SystemExit("serve --embedding needs --model FILE: a BERT-family GGUF file")
        model = bert.load(args.model)
        name = args.name or os.path.basename(args.model)
        app = create_app(model, name, api_key=args.api_key)
        print(f"silkattn serve: embeddings of {name} on http://{args.host}:{args.port}/v1", flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=GRACE)
        return
    path = args.model or llama.default_path()
    given = {name: getattr(args, name) for name in ("activations", "kv_dtype")
             if getattr(args, name) is not None}
    model = llama.load(path, **given)  # the rest: load's defaults
    name = args.name or os.path.basename(model.path)
    app = create_app(model, name, max_batch=args.max_batch, api_key=args.api_key,
                     cache_tokens=args.cache_tokens)
    print(f"silkattn serve: {name} on http://{args.host}:{args.port}/v1 (max batch {args.max_batch})",
          flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=GRACE)
