"""Chat templates: a model's Jinja template rendered as Hugging Face transformers renders it
(`apply_chat_template`), so a GGUF file's prompt is the one its model was trained on.

The environment is transformers': a sandbox that cannot mutate what it is handed, blocks trimmed
(trim_blocks, lstrip_blocks), `{% break %}` / `{% continue %}`, `{% generation %}` blocks (rendered as
their body), `tojson` without HTML escaping, `raise_exception(message)`, `strftime_now(format)`,
`dict(...)` and a `namespace` that refuses underscore names. The template sees `messages`, `tools`,
`documents`, `add_generation_prompt`, the file's special tokens (`bos_token`, `eos_token`, ...) and
any keyword the caller adds (`enable_thinking=False`, ...), which win over the special tokens.
Before rendering, keys whose value is None are dropped from each message, and a message's
reasoning, under any of `reasoning_content`, `thinking` or `reasoning`, is offered under the first
two names as well (gpt-oss's templates read `thinking`, the rest `reasoning_content`)."""
import datetime
import json
from collections.abc import Mapping

# the names a message's reasoning comes under; the first is the one templates read
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """The template refused the conversation (its raise_exception), or failed while rendering it."""


def _jinja():
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError as e:
        raise ImportError("chat templates need jinja2: pip install \"silkattn[llm]\"") from e
    return jinja2


_ENVIRONMENT = None


def _environment():
    global _ENVIRONMENT
    if _ENVIRONMENT is not None:
        return _ENVIRONMENT
    jinja2 = _jinja()

    class Generation(jinja2.ext.Extension):
        """{% generation %}...{% endgeneration %}: marks what the assistant wrote; renders its body."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """jinja's namespace, refusing names that begin with an underscore (a way out of the sandbox)."""

        def __init__(*args, **kwargs):
            self, attrs = args[0], dict(*args[1:], **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template may not set {name!r} on a namespace")

    class Dict:
        """dict(...) and dict.fromkeys(...) for templates, nothing else of the type."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, dict=Dict(), namespace=Namespace,
                       strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
    _ENVIRONMENT = env
    return env


def _plain(value, name):
    """value rebuilt from JSON's types (str, int, float, bool, None, dict, list, tuple), so the sandbox
    is handed no object with methods of its own; anything else is a TypeError naming where it was."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    # a subclass (an enum, numpy's float64) back to the plain type, without its methods
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, name): _plain(v, f"{name}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v, f"{name}[{i}]") for i, v in enumerate(value))
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return _plain(value.item(), name)  # a numpy scalar
    raise TypeError(f"{name} must hold only JSON values (str, numbers, bools, None, dicts, lists), "
                    f"got {type(value).__name__}")


def messages_for_template(messages):
    """messages checked (a list of dicts, each with a str role) and prepared as the template sees
    them: plain JSON values, None-valued keys dropped, reasoning offered under its names."""
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
    prepared = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise TypeError(f"messages[{i}] must be a dict, got {type(m).__name__}")
        if not isinstance(m.get("role"), str):
            raise TypeError(f"messages[{i}]['role'] must be a str, got {type(m.get('role')).__name__}")
        m = {k: v for k, v in _plain(dict(m), f"messages[{i}]").items() if v is not None}
        reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        prepared.append(m)
    return prepared


class ChatTemplate:
    """A model's chat templates: the default one and named ones (a GGUF file's
    tokenizer.chat_template.<name>, e.g. tool_use, chosen when tools are given), with the special
    tokens the templates may write."""

    def __init__(self, source, special_tokens=None, named=None):
        if not isinstance(source, str):
            raise TypeError(f"source must be a str (a Jinja template), got {type(source).__name__}")
        self.source, self.named = source, dict(named or {})
        self.special_tokens = dict(special_tokens or {})
        env, jinja2 = _environment(), _jinja()
        self._compiled = {}
        for name, text in [(None, source), *self.named.items()]:
            try:
                self._compiled[name] = env.from_string(text)
            except jinja2.exceptions.TemplateSyntaxError as e:
                which = "the chat template" if name is None else f"the chat template {name!r}"
                raise ValueError(f"{which} does not parse: {e.message} (line {e.lineno})") from None

    def source_for(self, tools=None):
        """The template used: the named tool_use one where tools are given and it exists."""
        return self.named["tool_use"] if tools and "tool_use" in self.named else self.source

    def render(self, messages, *, tools=None, documents=None, add_generation_prompt=False, **template_kwargs):
        """The prompt text of messages (see the module's docstring for what the template sees)."""
        messages = messages_for_template(messages)
        for name, value in (("tools", tools), ("documents", documents)):
            if value is not None and not (isinstance(value, (list, tuple))
                                          and all(isinstance(v, Mapping) for v in value)):
                raise TypeError(f"{name} must be a list of dicts (JSON schemas for tools), "
                                f"got {type(value).__name__}")
        template = self._compiled["tool_use" if tools and "tool_use" in self.named else None]
        variables = {**self.special_tokens, **_plain(template_kwargs, "template keyword")}
        jinja2 = _jinja()
        try:
            return template.render(messages=messages, tools=_plain(tools, "tools"),
                                   documents=_plain(documents, "documents"),
                                   add_generation_prompt=bool(add_generation_prompt), **variables)
        except jinja2.exceptions.SecurityError as e:
            raise ChatTemplateError(f"the chat template did what its sandbox forbids: {e}") from e
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"the chat template refused messages: {e}") from e
        except Exception as e:  # noqa: BLE001 - whatever the template's code raised on these messages
            raise ChatTemplateError(f"the chat template failed on messages: {type(e).__name__}: {e}") from e
