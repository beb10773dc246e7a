"""Chat templates: the real templates llama.cpp keeps (models/templates/*.jinja of its source) render
byte-identical to transformers' apply_chat_template over conversations with a system prompt, several
turns, an assistant's tool calls and the tool's answers, a tools list, add_generation_prompt and
template keywords, or both refuse; and, on templates written here, what silkattn's environment
offers them, the tool_use template of a GGUF file, refusals of bad arguments, and the reply's
reasoning split from its answer."""
import glob
import os

import pytest
import real_files

from silkattn.models import llama, reasoning
from silkattn.models.chat_template import ChatTemplate, ChatTemplateError

import llama_files

pytest.importorskip("jinja2", reason='pip install "silkattn[llm]"')

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}]


def _call(arguments, id_="call_1"):
    return {"id": id_, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


def _tool_turns(arguments, id_):
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [_call(arguments, id_)]},
            {"role": "tool", "tool_call_id": id_, "name": "get_weather", "content": "22 C"},
            {"role": "assistant", "content": "It is 22 C."}]


CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello"}],
    "turns": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
    "tool calls": _tool_turns({"city": "Paris"}, "call_1"),
    "tool calls, nine-character id, arguments as JSON text": _tool_turns('{"city": "Paris"}', "abc123XYZ"),
    "tool calls with a system prompt, content None": [{"role": "system", "content": "Use tools."}] + [
        {**m, "content": None} if m.get("tool_calls") else m
        for m in _tool_turns({"city": "Paris"}, "abc123XYZ")],
    "reasoning": [{"role": "user", "content": "Why?"},
                  {"role": "assistant", "content": "Because.", "reasoning_content": "Let me think."},
                  {"role": "user", "content": "And?"}],
    "unicode": [{"role": "user", "content": "数学 🙂 \"quotes\" <tag> & \n\n new lines"}],
}
# (conversation, add_generation_prompt, tools, template keywords)
CASES = [(name, g, None, {}) for name in CONVERSATIONS for g in (True, False)] + [
    ("user", True, TOOLS, {}), ("tool calls", False, TOOLS, {}),
    ("tool calls, nine-character id, arguments as JSON text", True, TOOLS, {}),
    ("user", True, None, {"enable_thinking": False}), ("reasoning", True, None, {"enable_thinking": True}),
    ("turns", True, None, {"enable_thinking": False, "reasoning_effort": "low"}),
    # Firefunction's template takes its tools as a keyword of text, with the date
    ("turns", True, None, {"functions": '[{"name": "get_weather"}]', "datetime": "2026-12-07"}),
    ("unicode", False, None, {"functions": "[]", "datetime": "2026-12-07"}),
    ("tool calls", False, None, {"functions": '[{"name": "get_weather"}]', "datetime": "2026-12-07"})]


def _templates():
    root = os.path.join(real_files.CACHE, f"llama-cpp-{real_files.VERSION}", "models", "templates")
    found = sorted(os.path.basename(p) for p in glob.glob(os.path.join(root, "*.jinja")))
    return found or ["(llama.cpp's templates, not fetched)"]


def _outcome(render):  # -> ("text", str) or ("error", None)
    try:
        return "text", render()
    except Exception:  # noqa: BLE001 - which exception class a template raises is not the claim
        return "error", None


@pytest.mark.parametrize("name", _templates())
def test_real_templates_render_as_transformers(name):
    path = os.path.join(real_files.llama_cpp_dir(), "models", "templates", name)  # skips without the sdist
    if not os.path.isfile(path):
        pytest.skip(f"llama.cpp's templates: {real_files.FETCH}")
    transformers = pytest.importorskip("transformers", reason="pip install transformers (the reference)")
    tokenizers = pytest.importorskip("tokenizers")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(tokenizers.models.BPE()), **SPECIAL)
    theirs.chat_template = source
    ours = ChatTemplate(source, SPECIAL)
    rendered = 0
    for conversation, generation, tools, kw in CASES:
        messages = CONVERSATIONS[conversation]
        expected = _outcome(lambda: theirs.apply_chat_template(
            messages, tools=tools, add_generation_prompt=generation, tokenize=False, **kw))
        got = _outcome(lambda: ours.render(messages, tools=tools, add_generation_prompt=generation, **kw))
        assert got == expected, (conversation, generation, bool(tools), kw)
        rendered += expected[0] == "text"
    assert rendered >= 3, "the template rendered too few of the conversations to be compared"


def test_the_suite_has_its_templates():
    templates = _templates()
    if templates[0].startswith("("):
        pytest.skip(f"llama.cpp's templates: {real_files.FETCH}")
    assert len(templates) >= 70


# ---------------------------------------------------------------- templates written here

def test_what_the_environment_offers():
    t = ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.content | tojson }}{% endfor %}"
                     "{% generation %}[{{ eos_token }}]{% endgeneration %}{{ tools | tojson(indent=1) }}"
                     "{% for i in range(3) %}{% if i == 1 %}{% break %}{% endif %}{{ i }}{% endfor %}"
                     "{{ dict(a=1) | tojson }}{% set ns = namespace(n=2) %}{{ ns.n }}{{ flag }}", SPECIAL)
    out = t.render([{"role": "user", "content": "<b>é</b>"}], tools=[{"x": 1}], flag="F")
    assert out == '<s>"<b>é</b>"[</s>][\n {\n  "x": 1\n }\n]0{"a": 1}2F'
    assert t.render([], bos_token="B").startswith("B")  # keywords win over the special tokens


def test_messages_are_prepared_as_transformers_prepares_them():
    t = ChatTemplate("{% for m in messages %}{{ m | tojson }};{% endfor %}")
    out = t.render([{"role": "assistant", "content": None, "tool_calls": [1]},
                    {"role": "assistant", "content": "a", "reasoning": "r"}])
    assert out == ('{"role": "assistant", "tool_calls": [1]};'
                   '{"thinking": "r", "role": "assistant", "content": "a", "reasoning": "r", '
                   '"reasoning_content": "r"};')


def test_refusals_name_what_was_wrong():
    t = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('Only user roles!') }}"
                     "{% endif %}ok")
    assert t.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="Only user roles!"):
        t.render([{"role": "system", "content": "x"}])
    assert issubclass(ChatTemplateError, ValueError)
    with pytest.raises(TypeError, match=r"messages\[0\]"):
        t.render(["hello"])
    with pytest.raises(TypeError, match=r"messages\[1\]\['role'\]"):
        t.render([{"role": "user", "content": "x"}, {"content": "y"}])
    with pytest.raises(TypeError, match="messages must be a list"):
        t.render("hello")
    with pytest.raises(TypeError, match="tools"):
        t.render([{"role": "user", "content": "x"}], tools="get_weather")
    with pytest.raises(TypeError, match=r"messages\[0\]\['content'\].*object"):
        t.render([{"role": "user", "content": object()}])
    with pytest.raises(ValueError, match="does not parse"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(TypeError, match="source"):
        ChatTemplate(None)


def test_the_sandbox_holds():
    """A template cannot reach Python's internals nor change what it is handed: each of these is
    refused (a ChatTemplateError, which the server answers with a 400), or renders nothing of what
    it reached for."""
    m = [{"role": "user", "content": "x"}]
    for source in ("{{ messages.__class__.__mro__ }}", "{{ ''.__class__.__base__.__subclasses__() }}",
                   "{{ raise_exception.__globals__ }}", "{% set ns = namespace() %}{% set ns._x = 1 %}",
                   "{{ messages.append(1) }}", "{{ messages[0].update(role='system') }}"):
        try:
            assert ChatTemplate(source).render(m) == "", source  # an unsafe attribute is undefined
        except ChatTemplateError as e:
            assert "sandbox forbids" in str(e)
    assert m == [{"role": "user", "content": "x"}]


TOOL_USE = "TOOLS:{{ tools | map(attribute='function.name') | join(',') }}|{{ messages[-1].content }}"


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("templates") / "tools.gguf")
    llama_files.write(path, "F32", template=[
        {"name": "default", "template": "PLAIN|{{ messages[-1].content }}{{ bos_token }}"},
        {"name": "tool_use", "template": TOOL_USE}])
    return llama.load(path, activations="float32", kv_dtype="float32")


def test_a_files_tool_use_template_is_used_where_tools_are_given(tool_model):
    m = [{"role": "user", "content": "hi"}]
    assert tool_model.apply_chat_template(m) == "PLAIN|hi" + tool_model.detokenize([tool_model.bos_id])
    assert tool_model.apply_chat_template(m, tools=TOOLS) == "TOOLS:get_weather|hi"
    assert tool_model.apply_chat_template(m, tools=[]).startswith("PLAIN|")


# ---------------------------------------------------------------- reasoning apart from the answer

SPLITS = [("<think>\nLet me see.\n</think>\n\nThe answer is 4.", False, "The answer is 4.", "Let me see."),
          ("Plain answer", False, "Plain answer", None),
          ("  <think>a</think>b", False, "b", "a"),
          ("<think>never closes  ", False, "", "never closes"),
          ("x<think>y</think>", False, "x<think>y</think>", None),
          ("<think></think>\n\nok", False, "ok", ""),
          ("\n\n", False, "\n\n", None),
          ("Let me think.\n</think>\n\nAnswer", True, "Answer", "Let me think."),
          ("still thinking", True, "", "still thinking")]


@pytest.mark.parametrize("text, inside, answer, thought", SPLITS)
def test_reasoning_splits_whole_and_streamed_alike(text, inside, answer, thought):
    reply = reasoning.split(text, inside)
    assert isinstance(reply, str) and str(reply) == answer and reply.reasoning_content == thought
    for size in (1, 2, 3, 7):
        s = reasoning.Splitter(inside)
        parts = [p for i in range(0, len(text), size) for p in s.feed(text[i:i + size])] + s.finish()
        assert "".join(t for f, t in parts if f == "content") == answer
        assert "".join(t for f, t in parts if f == "reasoning_content") == (thought or "")


THINKING = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is false %}<think></think>"
            "{% else %}<think>\n{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory):
    """A model whose template opens the <think> block in the prompt: its (random) reply never closes
    it, so all of it is reasoning unless enable_thinking is false."""
    path = str(tmp_path_factory.mktemp("templates") / "thinks.gguf")
    llama_files.write(path, "F32", template=THINKING)
    return llama.load(path, activations="float32", kv_dtype="float32")


def test_chat_returns_the_reasoning_apart(thinking_model):
    m, model = [{"role": "user", "content": "hi"}], thinking_model
    prompt = model.apply_chat_template(m)
    whole = model.complete(prompt, 6, ignore_eos=True)
    reply = model.chat(m, 6, ignore_eos=True)
    assert str(reply) == "" and reply.reasoning_content == whole.strip() and whole.strip()
    pieces = list(model.chat(m, 6, stream=True, ignore_eos=True))
    assert "".join(p for p in pieces if p.field == "reasoning_content") == whole.strip()
    assert not [p for p in pieces if p.field == "content"]
    kept = model.chat(m, 6, ignore_eos=True, reasoning_format="none")
    assert str(kept) == whole and kept.reasoning_content is None
    plain = model.chat(m, 6, ignore_eos=True, template_kwargs={"enable_thinking": False})
    answer = model.complete(model.apply_chat_template(m, enable_thinking=False), 6, ignore_eos=True)
    assert str(plain) == answer and plain.reasoning_content is None
    with pytest.raises(ValueError, match="reasoning_format"):
        model.chat(m, 2, reasoning_format="deepseek")
    with pytest.raises(TypeError, match="template_kwargs"):
        model.chat(m, 2, template_kwargs="enable_thinking")


def test_the_chat_command_shows_the_reasoning_and_takes_template_keywords(thinking_model, capsys):
    import silkattn
    from silkattn.__main__ import main

    m, model, previous = [{"role": "user", "content": "hi"}], thinking_model, silkattn.get_num_threads()
    try:
        exact = ["--activations", "float32", "--kv-dtype", "float32"]  # the fixture's load
        main(["chat", "--model", model.path, "--max-new-tokens", "5", "--threads", "1", "hi", *exact])
        thought = capsys.readouterr().out
        main(["chat", "--model", model.path, "--max-new-tokens", "5", "--threads", "1", "hi", *exact,
              "--chat-template-kwargs", '{"enable_thinking": false}'])
        plain = capsys.readouterr().out
        with pytest.raises(SystemExit):
            main(["chat", "--model", model.path, "hi", "--chat-template-kwargs", "[1]"])
    finally:
        silkattn.set_num_threads(previous)
    reply = model.chat(m, 5)
    assert thought == f"<think>\n{reply.reasoning_content}\n</think>\n"
    assert plain == model.chat(m, 5, template_kwargs={"enable_thinking": False}) + "\n"
