"""A thinking model's answer split in two, as llama.cpp's server and vLLM return it: the reasoning it
wrote between <think> and </think> (`reasoning_content`), and the answer after (`content`).

A reply is reasoning when it opens with <think> (after white space), or when its prompt ends inside
an open <think> block (DeepSeek-R1's template writes the tag itself); the reasoning ends at </think>,
or with the reply if it never closes. White space around the reasoning and before the answer is
dropped. Text that does not open with <think> is all answer. Whether a model's replies are split is
`reasoning_format`: "auto" splits where the chat template knows </think>, "none" never."""

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("auto", "none")


def check_format(reasoning_format):
    if reasoning_format not in FORMATS:
        raise ValueError(f"reasoning_format must be one of {', '.join(map(repr, FORMATS))}, "
                         f"got {reasoning_format!r}")
    return reasoning_format


def template_thinks(source):
    """Whether a chat template's model writes <think> blocks (its source closes one)."""
    return source is not None and CLOSE in source


def prompt_opens_reasoning(prompt):
    """Whether the prompt's text ends inside a <think> block the reply will continue."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


class Reply(str):
    """The assistant's answer, with .reasoning_content: the reasoning written before it, or None
    where the reply had no <think> block (or was not split)."""

    def __new__(cls, content, reasoning_content=None):
        reply = super().__new__(cls, content)
        reply.reasoning_content = reasoning_content
        return reply


class Piece(str):
    """A piece of a streamed reply; .field is "content" or "reasoning_content", the part it belongs to."""

    def __new__(cls, text, field):
        piece = super().__new__(cls, text)
        piece.field = field
        return piece


def _partial(text, tag):  # -> length of the longest end of text that begins tag
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class Splitter:
    """Streamed text in, (field, text) pieces out: feed() each piece as it comes, then finish().
    A piece that could still be the start of a tag, or white space that could end the reasoning,
    is held back until the text after it decides."""

    def __init__(self, inside=False):
        # state: "start" (nothing but white space seen), "reasoning", "answer"
        self.state = "reasoning" if inside else "start"
        self.buffer, self.reasoning_seen, self.answer_seen = "", False, False
        self.had_reasoning = inside

    def feed(self, text):  # -> [(field, text), ...]
        self.buffer += text
        out = []
        while True:
            if self.state == "start":
                head = self.buffer.lstrip()
                if head.startswith(OPEN):
                    self.buffer, self.state, self.had_reasoning = head[len(OPEN):], "reasoning", True
                    continue
                if not head or OPEN.startswith(head):
                    return out  # still could be white space then <think>
                self.state = "answer"  # an answer without reasoning keeps its leading white space
                continue
            if self.state == "reasoning":
                at = self.buffer.find(CLOSE)
                if at >= 0:
                    self._emit(out, "reasoning_content", self.buffer[:at].rstrip())
                    self.buffer, self.state = self.buffer[at + len(CLOSE):], "after"
                    continue
                keep = _partial(self.buffer, CLOSE)
                body = self.buffer[:len(self.buffer) - keep]
                ready = body.rstrip()  # trailing white space waits: it may come just before </think>
                self._emit(out, "reasoning_content", ready)
                self.buffer = self.buffer[len(ready):]
                return out
            if self.state == "after":  # white space between </think> and the answer is dropped
                self.buffer = self.buffer.lstrip()
                if not self.buffer:
                    return out
                self.state = "answer"
                continue
            self._emit(out, "content", self.buffer)
            self.buffer = ""
            return out

    def finish(self):  # -> the pieces still held
        out = []
        if self.state == "start":
            self._emit(out, "content", self.buffer)
        elif self.state == "reasoning":
            self._emit(out, "reasoning_content", self.buffer.rstrip())
        elif self.state == "answer":
            self._emit(out, "content", self.buffer)
        self.buffer = ""
        return out

    def _emit(self, out, field, text):
        if field == "reasoning_content" and not self.reasoning_seen:
            text = text.lstrip()
        if text:
            if field == "reasoning_content":
                self.reasoning_seen = True
            out.append((field, text))


def split(text, inside=False):  # -> Reply
    """The whole reply split: Reply(answer, reasoning_content=reasoning or None)."""
    s = Splitter(inside)
    parts = s.feed(text) + s.finish()
    reasoning = "".join(t for f, t in parts if f == "reasoning_content")
    return Reply("".join(t for f, t in parts if f == "content"), reasoning if s.had_reasoning else None)
