"""python -m silkattn serve's app, live on the loopback (uvicorn in a thread, a small GGUF file): the
official openai client gets what model.complete and model.chat write, streamed identically, also
when many ask at once; every bad request is refused with its status and OpenAI's error body before
it reaches the model; a client that drops a stream frees its slot; SIGINT ends the server. Every
request is bounded in time."""
import concurrent.futures
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("uvicorn", reason='pip install "silkattn[serve]"')
openai = pytest.importorskip("openai", reason='pip install "silkattn[test]"')

from live_server import live  # noqa: E402

from silkattn import serve  # noqa: E402
from silkattn.models import llama, runner  # noqa: E402

import llama_files  # noqa: E402

KEY, NAME, TIMEOUT = "sekret", "tiny", 60


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("serve") / "tiny.gguf")
    llama_files.write(p, "Q8_0", context=128)
    return p


@pytest.fixture(scope="module")
def server(path):
    """(base URL, app, model) of a live server on 127.0.0.1, stopped after the module."""
    yield from _serve(path)


def _serve(path):
    model = llama.load(path)
    app = serve.create_app(model, NAME, max_batch=4, api_key=KEY)
    with live(app) as url:
        yield url, app, model


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0)


def _raw(server, method, route, body=None, headers=None):  # -> (status, parsed JSON body)
    url = server[0].removeprefix("http://")
    conn = http.client.HTTPConnection(url, timeout=TIMEOUT)
    data = body if isinstance(body, (str, bytes)) or body is None else json.dumps(body)
    conn.request(method, route, data, {"Authorization": f"Bearer {KEY}", **(headers or {})})
    r = conn.getresponse()
    status, text = r.status, r.read()
    conn.close()
    return status, json.loads(text) if text else None


def _send(server, body):  # -> the socket a completion request went out on, its answer unread
    sock = socket.create_connection(server[0].removeprefix("http://").split(":"), timeout=TIMEOUT)
    body = json.dumps(body)
    sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
    return sock


MESSAGES = [[{"role": "user", "content": "the cat"}],
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo wörld"}],
            [{"role": "user", "content": "a b c"}, {"role": "assistant", "content": "d"},
             {"role": "user", "content": "e"}]]


def test_health_and_models(server, client):
    assert _raw(server, "GET", "/health", headers={"Authorization": ""}) == (200, {"status": "ok"})
    assert [m.id for m in client.models.list().data] == [NAME]


def test_completion_is_model_complete(server, client):
    model = server[2]
    r = client.completions.create(model=NAME, prompt="the cat", max_tokens=12, temperature=0)
    assert r.choices[0].text == model.complete("the cat", 12)
    assert r.usage.prompt_tokens == len(model.prompt_ids("the cat")) and r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12 and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens_details.cached_tokens == 0  # alone: no other sequence's keys to take


def test_a_conversation_asked_again_takes_its_beginning_s_keys(server, client):
    """One request after another: the second's prompt begins as the first's (a long system prompt),
    whose pages were kept when it ended; it copies their keys (usage.prompt_tokens_details.
    cached_tokens) and still writes what model.chat writes."""
    model = server[2]
    system = {"role": "system", "content": "you answer in few words, " * 2}
    cached = []
    for question in ("the cat", "a dog"):
        messages = [system, {"role": "user", "content": question}]
        r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=6, temperature=0)
        assert r.choices[0].message.content == model.chat(messages, 6)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
    assert cached[1] > 0 and cached[1] < r.usage.prompt_tokens


def test_a_prompt_takes_the_keys_of_one_running_and_says_so(path):
    """The engine held on A's first token while B, whose prompt begins as A's, comes: B's prefill
    copies the keys of their common positions from A's pages (its first event says how many: the
    usage's prompt_tokens_details.cached_tokens) and writes what generate writes for it alone."""
    model = llama.load(path)
    if not runner.shareable(model, 40):
        pytest.skip("the backend's attention takes no prompt's keys from another (no compiled kernel)")
    engine, go, events = serve.Engine(model, max_batch=4), threading.Event(), {"a": [], "b": []}

    def sink_a(event):
        events["a"].append(event)
        if event[0] == "token" and len(events["a"]) == 2:
            go.wait(TIMEOUT)

    base = list(range(3, 40))
    try:
        engine.submit(base + [50], 40, {"ignore_eos": True}, sink_a)
        deadline = time.time() + TIMEOUT
        while len(events["a"]) < 2:
            assert time.time() < deadline
            time.sleep(0.01)
        engine.submit(base + [60, 61], 6, {"ignore_eos": True}, events["b"].append)
        go.set()
        while not events["b"] or events["b"][-1][0] != "done":
            assert time.time() < deadline
            time.sleep(0.01)
    finally:
        go.set()
        engine.stop()
    assert events["a"][0] == ("cached", 0) and events["b"][0][0] == "cached"
    assert 0 < events["b"][0][1] <= len(base)
    assert [v for e, v in events["b"] if e == "token"] == model.generate(base + [60, 61], 6, ignore_eos=True)


@pytest.mark.parametrize("messages", MESSAGES, ids=["user", "system", "turns"])
def test_chat_is_model_chat_and_streams_the_same(server, client, messages):
    model = server[2]
    expected = model.chat(messages, 20)
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=20, temperature=0)
    assert r.choices[0].message.content == expected and r.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == expected and reasons == [r.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_streamed_completion_ends_with_done(server):
    url = server[0].removeprefix("http://")
    conn = http.client.HTTPConnection(url, timeout=TIMEOUT)
    conn.request("POST", "/v1/completions", json.dumps({"model": NAME, "prompt": "a", "max_tokens": 5,
                                                        "temperature": 0, "stream": True}),
                 {"Authorization": f"Bearer {KEY}"})
    r = conn.getresponse()
    events = [e for e in r.read().decode().split("\n\n") if e]
    conn.close()
    assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    last = json.loads(events[-2][6:])
    assert last["choices"][0]["finish_reason"] == "length"
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
    assert text == server[2].complete("a", 5)


def test_concurrent_requests_are_each_what_they_would_be_alone(server, client):
    """More requests than slots, each its own prompt, length and seed: the batch changes nothing."""
    model = server[2]
    asks = [(f"{w} " * (i % 4 + 1), 6 + 3 * i, i) for i, w in enumerate("abcdefgh")]

    def ask(a):
        prompt, n, seed = a
        return client.completions.create(model=NAME, prompt=prompt, max_tokens=n, temperature=0.9, seed=seed)
    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
        answers = list(pool.map(ask, asks))
    for (prompt, n, seed), r in zip(asks, answers):
        assert r.choices[0].text == model.complete(prompt, n, temperature=0.9, seed=seed)


def test_stop_strings(server, client):
    model = server[2]
    full = model.complete("the cat", 30)
    stop = full[5:8]
    r = client.completions.create(model=NAME, prompt="the cat", max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].text == full[:full.index(stop)] and r.choices[0].finish_reason == "stop"
    chunks = client.completions.create(model=NAME, prompt="the cat", max_tokens=30, temperature=0, stop=stop,
                                       stream=True)
    assert "".join(c.choices[0].text for c in chunks) == full[:full.index(stop)]


GOOD = {"model": NAME, "prompt": "a", "max_tokens": 4}
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "a"}], "max_tokens": 4}


@pytest.mark.parametrize("route, body, status, param", [
    ("/v1/completions", "{not json", 400, None),
    ("/v1/completions", "[1, 2]", 400, None),
    ("/v1/completions", {"prompt": "a"}, 400, "model"),
    ("/v1/completions", {**GOOD, "model": "gpt-4"}, 404, "model"),
    ("/v1/completions", {**GOOD, "prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"model": NAME}, 400, "prompt"),
    ("/v1/completions", {**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {**GOOD, "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {**GOOD, "max_tokens": "4"}, 400, "max_tokens"),
    ("/v1/completions", {**GOOD, "max_tokens": True}, 400, "max_tokens"),
    ("/v1/completions", {**GOOD, "temperature": 3}, 400, "temperature"),
    ("/v1/completions", {**GOOD, "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {**GOOD, "n": 17}, 400, "n"),
    ("/v1/completions", {**GOOD, "n": 0}, 400, "n"),
    ("/v1/completions", {**GOOD, "stop": ["a"] * 5}, 400, "stop"),
    ("/v1/completions", {**GOOD, "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {**GOOD, "prompt": "x" * 200}, 400, "prompt"),
    ("/v1/completions", {**GOOD, "max_tokens": 500}, 400, "prompt"),
    ("/v1/chat/completions", {"model": NAME}, 400, "messages"),
    ("/v1/chat/completions", {"model": NAME, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages[0]"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": 3}]}, 400,
     "messages[0]"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     400, "messages[0]"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "assistant", "content": None}]}, 400,
     "messages[0]"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{city"}}]}]}, 400,
     "messages[0].tool_calls"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function"}]}]}, 400, "messages[0].tool_calls"),
    ("/v1/chat/completions", {**CHAT, "tools": {"get_weather": {}}}, 400, "tools"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {}}]}, 400, "tools"),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": ["enable_thinking"]}, 400,
     "chat_template_kwargs"),
    ("/v1/chat/completions", {**CHAT, "reasoning_format": "deepseek"}, 400, "reasoning_format"),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"add_generation_prompt": False}}, 400,
     "messages"),
])
def test_bad_requests_get_openai_errors(server, route, body, status, param):
    got, answer = _raw(server, "POST", route, body)
    assert got == status, answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert server[1].state.silkattn["engine"].batch.idle  # nothing reached the model


@pytest.mark.parametrize("headers", [{"Authorization": ""}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": f"Basic {KEY}"}])
def test_a_wrong_or_missing_key_gets_401(server, headers):
    for method, route, body in (("GET", "/v1/models", None), ("POST", "/v1/completions", GOOD),
                                ("POST", "/v1/chat/completions", {"model": NAME, "messages": MESSAGES[0]})):
        status, answer = _raw(server, method, route, body, headers)
        assert status == 401 and answer["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server[0] + "/v1", api_key="wrong", max_retries=0).models.list()


def test_a_dropped_stream_frees_its_slot(server, client):
    engine = server[1].state.silkattn["engine"]
    sock = _send(server, {"model": NAME, "prompt": "a", "max_tokens": 100, "temperature": 0, "stream": True})
    got = b""
    while b"data: " not in got:  # the stream has begun
        chunk = sock.recv(4096)
        assert chunk, "the server closed the stream"
        got += chunk
    sock.close()
    deadline = time.time() + TIMEOUT
    while not engine.batch.idle:
        assert time.time() < deadline, "the dropped stream's sequence still runs"
        time.sleep(0.05)
    assert engine.batch.pool.free == engine.batch.pool.pages
    r = client.completions.create(model=NAME, prompt="a", max_tokens=3, temperature=0)
    assert r.choices[0].text == server[2].complete("a", 3)


def test_a_client_gone_before_a_whole_answer_frees_its_slot(server, client):
    """A non-streaming request whose client hangs up mid-generation (steps slowed to 20 ms, so that
    its 120 tokens would take 2.4 s): its sequence is cancelled within about serve.POLL, not run to
    the end, and its pages come back."""
    engine = server[1].state.silkattn["engine"]
    real, steps = engine.batch.step, []

    def slow():
        steps.append(1)
        time.sleep(0.02)
        return real()
    engine.batch.step = slow
    try:
        sock = _send(server, {"model": NAME, "prompt": "a", "max_tokens": 120, "temperature": 0})
        deadline = time.time() + TIMEOUT
        while len(steps) < 5:  # it runs
            assert time.time() < deadline, "the request did not start"
            time.sleep(0.01)
        sock.close()
        while not engine.batch.idle:
            assert time.time() < deadline, "the sequence of a client gone still runs"
            time.sleep(0.01)
    finally:
        engine.batch.step = real
    assert len(steps) < 100 and engine.batch.pool.free == engine.batch.pool.pages
    r = client.completions.create(model=NAME, prompt="a", max_tokens=3, temperature=0)
    assert r.choices[0].text == server[2].complete("a", 3)


def test_a_fault_in_a_step_fails_its_requests_alone(server, client):
    """A step that raises (a fault of silkattn's, injected): its requests get a 500 with OpenAI's
    body, their pages come back, the engine goes on serving."""
    engine = server[1].state.silkattn["engine"]
    real, calls = engine.batch.step, []

    def broken():
        if not calls:
            calls.append(1)
            raise RuntimeError("injected")
        return real()
    engine.batch.step = broken
    try:
        status, answer = _raw(server, "POST", "/v1/completions", {**GOOD, "temperature": 0})
    finally:
        engine.batch.step = real
    assert status == 500 and answer["error"]["type"] == "server_error"
    assert "injected" in answer["error"]["message"]
    assert engine.batch.idle and engine.batch.pool.free == engine.batch.pool.pages
    r = client.completions.create(model=NAME, prompt="a", max_tokens=3, temperature=0)
    assert r.choices[0].text == server[2].complete("a", 3)


def test_sigint_stops_the_server(path):
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-m", "silkattn", "serve", "--model", path, "--port", str(port),
                             "--name", NAME], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.time() + TIMEOUT
        while True:
            assert time.time() < deadline and proc.poll() is None, "the server did not start"
            try:
                status, _ = _raw((f"http://127.0.0.1:{port}",), "GET", "/health")
                break
            except OSError:
                time.sleep(0.1)
        assert status == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


# A template that shows the tools it is given and a tool call's arguments, and opens the reply's
# <think> block unless enable_thinking is false: the tiny model's (random) reply never closes it.
THINKING = ("{% if tools %}[{{ tools | map(attribute='function.name') | join(',') }}]{% endif %}"
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
            "{% for c in m.tool_calls or [] %}({{ c.function.arguments.city }}){% endfor %}{% endfor %}"
            "{% if add_generation_prompt %}:{% if enable_thinking is false %}<think></think>"
            "{% else %}<think>\n{% endif %}{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("serve") / "thinks.gguf")
    llama_files.write(p, "Q8_0", context=128, template=THINKING)
    yield from _serve(p)


def _chat(server, **fields):  # -> the whole answer's message, its usage
    status, answer = _raw(server, "POST", "/v1/chat/completions",
                          {"model": NAME, "max_tokens": 6, "temperature": 0, **fields})
    assert status == 200, answer
    return answer["choices"][0]["message"], answer["usage"]


def test_a_thinking_models_reasoning_comes_apart(thinking_server):
    model, m = thinking_server[2], [{"role": "user", "content": "hi"}]
    expected = model.chat(m, 6)
    message, _ = _chat(thinking_server, messages=m)
    assert message["content"] == "" and message["reasoning_content"] == expected.reasoning_content != ""
    client = openai.OpenAI(base_url=thinking_server[0] + "/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0)
    chunks = list(client.chat.completions.create(model=NAME, messages=m, max_tokens=6, temperature=0,
                                                 stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == \
        expected.reasoning_content
    assert "".join(d.content or "" for d in deltas) == ""
    whole, _ = _chat(thinking_server, messages=m, reasoning_format="none")
    assert whole["content"] == model.chat(m, 6, reasoning_format="none") and "reasoning_content" not in whole


def test_tools_and_template_keywords_reach_the_template(thinking_server):
    model, m = thinking_server[2], [{"role": "user", "content": "hi"}]
    plain, _ = _chat(thinking_server, messages=m, chat_template_kwargs={"enable_thinking": False})
    expected = model.chat(m, 6, template_kwargs={"enable_thinking": False})
    assert plain["content"] == expected and expected.reasoning_content is None
    _, usage = _chat(thinking_server, messages=m, tools=TOOLS)
    assert usage["prompt_tokens"] == len(model.prompt_ids(model.apply_chat_template(m, tools=TOOLS)))
    assert usage["prompt_tokens"] > len(model.prompt_ids(model.apply_chat_template(m)))
    # OpenAI sends a tool call's arguments as JSON text; the template reads them as an object
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    turns = m + [{"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "c1", "content": "3 C"}]
    _, usage = _chat(thinking_server, messages=turns, tools=TOOLS)
    decoded = {**call, "function": {**call["function"], "arguments": {"city": "Oslo"}}}
    as_object = [{**t, "tool_calls": [decoded]} if t.get("tool_calls") else t for t in turns]
    prompt = model.apply_chat_template(as_object, tools=TOOLS)
    assert "(Oslo)" in prompt and usage["prompt_tokens"] == len(model.prompt_ids(prompt))


def _metrics(base, headers=None):  # -> {sample name with its labels: value} of GET /metrics
    conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=TIMEOUT)
    conn.request("GET", "/metrics", headers=headers or {})
    r = conn.getresponse()
    status, text = r.status, r.read().decode()
    conn.close()
    assert status == 200, text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_metrics_count_requests_tokens_and_pages(server, client):
    """GET /metrics (Prometheus's text format, the key asked as for any route): responses by route
    and status, tokens in and out, and at rest no sequence and no page held."""
    before = _metrics(server[0], {"Authorization": f"Bearer {KEY}"})
    r = client.completions.create(model=NAME, prompt="the cat", max_tokens=5, temperature=0, extra_body={
        "ignore_eos": True})
    assert _raw(server, "POST", "/v1/completions", {"model": NAME})[0] == 400
    deadline = time.time() + TIMEOUT
    while not server[1].state.silkattn["engine"].batch.idle:
        assert time.time() < deadline
        time.sleep(0.01)
    after = _metrics(server[0], {"Authorization": f"Bearer {KEY}"})

    def grew(name):
        return after.get(name, 0) - before.get(name, 0)
    assert grew('silkattn_requests_total{route="/v1/completions",status="200"}') == 1
    assert grew('silkattn_requests_total{route="/v1/completions",status="400"}') == 1
    assert grew("silkattn_prompt_tokens_total") == r.usage.prompt_tokens
    assert grew("silkattn_generation_tokens_total") == r.usage.completion_tokens
    assert after["silkattn_sequences_running"] == after["silkattn_sequences_waiting"] == 0
    assert after["silkattn_kv_pages_taken"] == 0 and after["silkattn_kv_pages_total"] > 0
    assert 0 <= after["silkattn_prefix_reuse_ratio"] <= 1 and after["silkattn_decode_tokens_per_second"] > 0
    status, body = _raw(server, "GET", "/metrics", headers={"Authorization": "Bearer wrong"})
    assert status == 401


def test_chat_logprobs_are_the_model_s_and_stream_alike(server, client):
    """Each token's log-probability is log_softmax of the model's logits at it (float64), greedy's
    the largest of its top_logprobs; the bytes join into the answer; streamed, the same entries."""
    model, messages = server[2], [{"role": "user", "content": "the cat"}]
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    joined = b"".join(bytes(e.bytes) for e in entries)  # random weights: not always whole UTF-8
    assert joined.decode("utf-8", "replace") == r.choices[0].message.content
    ids = model.prompt_ids(model.apply_chat_template(messages))
    logits = model.forward(ids)[-1].astype(np.float64)
    first = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
    assert abs(entries[0].logprob - first.max()) < 1e-3
    for e in entries:
        assert len(e.top_logprobs) == 3 and e.logprob == e.top_logprobs[0].logprob <= 0
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
    chunks = client.chat.completions.create(model=NAME, messages=messages, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=3, stream=True)
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    # the second request takes the first's keys (copied, within a float32 GEMM's rounding)
    assert [e.token for e in streamed] == [e.token for e in entries]
    np.testing.assert_allclose([e.logprob for e in streamed], [e.logprob for e in entries], atol=1e-5)


def test_completion_logprobs_follow_the_text(client):
    r = client.completions.create(model=NAME, prompt="the cat", max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert all(x <= 0 for x in lp.token_logprobs) and all(1 <= len(t) <= 2 for t in lp.top_logprobs)


@pytest.mark.parametrize("route, body, param", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
    ("/v1/completions", {"logprobs": 6}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
])
def test_bad_logprobs_are_refused_by_name(server, route, body, param):
    base = {"model": NAME, "max_tokens": 2, **({"messages": [{"role": "user", "content": "a"}]}
                                                if "chat" in route else {"prompt": "a"})}
    status, answer = _raw(server, "POST", route, {**base, **body})
    assert status == 400 and answer["error"]["param"] == param


def test_n_answers_are_forks_each_as_chat_writes_it(server, client):
    """n > 1: the prompt computed once (the others fork its pages), each answer as model.chat writes
    it with seed + i; streamed, each choice's pieces make the same text; usage counts every answer."""
    model, messages = server[2], [{"role": "user", "content": "the cat"}]
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0.9, seed=5,
                                       n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert texts == [model.chat(messages, 8, temperature=0.9, seed=5 + i) for i in range(3)]
    ids = model.prompt_ids(model.apply_chat_template(messages))
    assert r.usage.completion_tokens == sum(len(model.generate(ids, 8, temperature=0.9, seed=5 + i))
                                            for i in range(3))
    chunks = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0.9,
                                            seed=5, n=3, stream=True)
    streamed = ["", "", ""]
    for c in chunks:
        for choice in c.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == texts
