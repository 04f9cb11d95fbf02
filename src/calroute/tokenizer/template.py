"""Chat templates rendered as transformers renders them for vLLM, inside bounds.

Followed: transformers' chat_template_utils.py ``_cached_compile_jinja_template`` (an
``ImmutableSandboxedEnvironment`` with ``trim_blocks``, ``lstrip_blocks``, the ``{% generation %}`` tag and
``loopcontrols``; the ``tojson`` filter without HTML escaping, the ``raise_exception`` and ``strftime_now``
globals) and ``render_jinja_template`` (documents must be dicts; how ``continue_final_message`` marks the
final message and cuts the rendered text after it); vLLM 0.32's vllm/renderers/hf.py
``_detect_content_format`` (the "openai" content format when the template loops over a message's content),
``_detect_developer_role_support`` and ``_resolve_chat_template_kwargs`` (the template's undeclared
variables: which request kwargs reach it).

Bounded, since jinja2 cannot be interrupted from its own thread: the output (``max_output_chars``, counted as
the render streams; a ``*`` or ``**`` whose result would pass it, or any call given an integer above it, is
refused before it allocates) and the time (``max_render_s``, checked at every output chunk, call, attribute
and item access, which every loop over input or ``range`` (itself capped at 100k items by the sandbox) goes
through). What stays unbounded: a loop whose body does none of those, over a sequence the template built
itself; and memory held by strings joined with ``~`` inside such a loop.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from calroute.contract.tokenizer import TokenizeError
from calroute.errors import CalrouteError
from calroute.tokenizer.messages import ContentFormat

# transformers' marker appended to the message continued, cut from the rendered text after it.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_MAX_COMPILED = 32  # request templates are few and reused; vLLM bounds its own caches at 32 as well


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: marks the assistant's tokens for training masks; when
    rendering a prompt it is only its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' template environment with a deadline and an output cap (the module docstring says
    where they are checked). One render at a time: ``Renderer`` holds the lock around it."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, max_output_chars: int) -> None:
        super().__init__(
            trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
        )
        self.max_output_chars = max_output_chars
        self.deadline_s = float("inf")  # time.monotonic() by which the current render must end
        self.filters["tojson"] = _tojson
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now

    def tick(self) -> None:
        if time.monotonic() > self.deadline_s:
            raise SecurityError("the chat template took too long to render")

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        self.tick()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple)
                    and isinstance(n, int)
                    and len(seq) * n > self.max_output_chars
                ):
                    raise SecurityError("the chat template built a value past the output limit")
        elif isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 64:
            raise SecurityError("the chat template raised a number to too large a power")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        __self.tick()
        if any(type(a) is int and a > __self.max_output_chars for a in (*args, *kwargs.values())):
            raise SecurityError("the chat template called a function with a size past the output limit")
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.tick()
        return super().getitem(obj, argument)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class Renderer:
    """Compiles, inspects and renders chat templates, each compiled once (up to ``_MAX_COMPILED``)."""

    def __init__(self, max_output_chars: int, max_render_s: float) -> None:
        self._env = BoundedEnvironment(max_output_chars)
        self._max_render_s = max_render_s
        self._lock = threading.Lock()
        self._compiled: dict[str, tuple[jinja2.Template, ContentFormat, frozenset[str]]] = {}

    def _template(self, source: str) -> tuple[jinja2.Template, ContentFormat, frozenset[str]]:
        if (hit := self._compiled.get(source)) is not None:
            return hit
        try:
            ast = self._env.parse(source)
            compiled = self._env.from_string(source)
        except jinja2.TemplateError as e:
            raise TokenizeError(str(e)) from e
        entry = (compiled, content_format(ast), frozenset(jinja2.meta.find_undeclared_variables(ast)))
        if len(self._compiled) >= _MAX_COMPILED:
            self._compiled.clear()
        self._compiled[source] = entry
        return entry

    def content_format(self, source: str) -> ContentFormat:
        return self._template(source)[1]

    def variables(self, source: str) -> frozenset[str]:
        """The template's undeclared variables: the request's chat_template_kwargs that reach it."""
        return self._template(source)[2]

    def render(
        self,
        source: str,
        messages: list[dict[str, Any]],
        continue_final_message: bool,
        **context: Any,
    ) -> str:
        """The rendered prompt (transformers' render_jinja_template); TokenizeError with the text vLLM answers
        when the template or the conversation is refused."""
        compiled = self._template(source)[0]
        documents = context.get("documents")
        if documents is not None and any(not isinstance(d, dict) for d in documents):
            raise TokenizeError("Documents should be a list of dicts with 'title' and 'text' keys!")
        final = None
        if continue_final_message:
            messages, final = _mark_final_message(messages, source)
        with self._lock:
            self._env.deadline_s = time.monotonic() + self._max_render_s
            try:
                rendered = "".join(self._bounded(compiled.generate(messages=messages, **context)))
            except jinja2.TemplateError as e:  # raise_exception, an undefined variable, a sandbox limit
                raise TokenizeError(str(e)) from e
            except TokenizeError:
                raise
            except Exception as e:  # the template's own Python errors (a bad filter argument): a 400 too
                raise TokenizeError(str(e)) from e
            finally:
                self._env.deadline_s = float("inf")
        return rendered if final is None else _cut_after_final_message(rendered, final)

    def _bounded(self, chunks: Iterator[str]) -> Iterator[str]:
        total_chars = 0
        for chunk in chunks:
            total_chars += len(chunk)
            if total_chars > self._env.max_output_chars:
                raise TokenizeError(
                    f"the chat template's output passed {self._env.max_output_chars} characters"
                )
            self._env.tick()
            yield chunk


def _mark_final_message(messages: list[dict[str, Any]], source: str) -> tuple[list[dict[str, Any]], str]:
    """A copy of ``messages`` whose last message's text ends with the tag, and that text before it."""
    if not messages:
        raise TokenizeError(
            "Cannot apply chat template to an empty conversation. Provide at least one message."
        )
    last = dict(messages[-1])
    final = last.get("content")
    if final is None:
        raise TokenizeError(
            'continue_final_message is set but the final message has no "content" to continue!'
        )
    if "content" not in source:
        raise TokenizeError(
            'continue_final_message is set to "content" but this is not an accepted field in the '
            "chat_template"
        )
    if isinstance(final, list | tuple):
        parts = [dict(p) if isinstance(p, dict) else p for p in final]
        for part in reversed(parts):
            if "text" in part:
                final = part["text"]
                part["text"] = part["text"] + _CONTINUE_TAG
                break
        else:
            raise TokenizeError(
                "continue_final_message is set but we could not find any text to continue in the final "
                "message!"
            )
        last["content"] = parts
    else:
        last["content"] = final + _CONTINUE_TAG
    return [*messages[:-1], last], final


def _cut_after_final_message(rendered: str, final: str) -> str:
    if final.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
        raise TokenizeError(
            "continue_final_message is set but the final message does not appear in the chat after applying "
            "the chat template! This can happen if the chat template deletes portions of the final message. "
            "Please verify the chat template and final message in your chat to ensure they are compatible."
            f"Final message to continue: {final.strip()}\nRendered chat:\n{rendered}"
        )
    tag_at = rendered.rindex(_CONTINUE_TAG.strip())
    if rendered[tag_at : tag_at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:tag_at]
    return rendered[:tag_at].rstrip()  # the template trimmed the tag's trailing space: trim as it did


def supports_developer_role(source: str) -> bool:
    return '"developer"' in source or "'developer'" in source


# ---- the content format (vLLM's _detect_content_format) ------------------------------------------------


def content_format(ast: jinja2.nodes.Template) -> ContentFormat:
    """The "openai" format when the template loops over a message's content (so it expects a list of
    parts), else "string". A template this reading cannot follow (a tuple target) is "string", as vLLM's
    default."""
    try:
        return "openai" if any(True for _ in _content_loops(ast)) else "string"
    except _Unreadable:
        return "string"


class _Unreadable(CalrouteError):
    """A template whose content loops the detection cannot follow (read as the "string" format)."""


def _is_name(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_field(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return (
            _is_name(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
        )
    return isinstance(node, jinja2.nodes.Getattr) and _is_name(node.node, name) and node.attr == key


def _reads(node: jinja2.nodes.Node, name: str, key: str | None = None) -> bool:
    """``node`` is ``name`` (or its field ``key``), maybe through filters, tests and slices."""
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _reads(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _reads(node.node, name, key)
    return _is_field(node, name, key) if key else _is_name(node, name)


def _target(node: jinja2.nodes.Node) -> str:
    if not isinstance(node, jinja2.nodes.Name):
        raise _Unreadable
    return node.name


def _aliases(ast: jinja2.nodes.Template, name: str) -> list[str]:
    """``name`` and every variable set from it (``{% set msgs = messages[1:] %}``), transitively."""
    found, queue = [name], [name]
    while queue:
        current = queue.pop(0)
        for assign in ast.find_all(jinja2.nodes.Assign):
            if _reads(assign.node, current):
                alias = _target(assign.target)
                found.append(alias)
                if alias != current:
                    queue.append(alias)
    return found


def _message_names(ast: jinja2.nodes.Template) -> list[str]:
    """The loop variables over the messages (``{% for message in messages %}``)."""
    lists = _aliases(ast, "messages")
    return [
        _target(loop.target)
        for loop in ast.find_all(jinja2.nodes.For)
        if any(_reads(loop.iter, n) for n in lists)
    ]


def _content_loops(ast: jinja2.nodes.Template) -> Iterator[jinja2.nodes.For]:
    messages = _message_names(ast)
    # Macros handed a message's content under another parameter name
    content_params: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    for macro in ast.find_all(jinja2.nodes.Macro):
        names = {arg.name for arg in macro.args}
        params: set[str] = set()
        for call in ast.find_all(jinja2.nodes.Call):
            if not (isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(macro.args) and any(_reads(arg, m, "content") for m in messages):
                    params.add(macro.args[i].name)
            for kw in call.kwargs:
                if kw.key in names and any(_reads(kw.value, m, "content") for m in messages):
                    params.add(kw.key)
        for loop in macro.find_all(jinja2.nodes.For):
            in_macros.add(id(loop))
            if params:
                content_params[id(loop)] = params
    for loop in ast.find_all(jinja2.nodes.For):
        if any(_reads(loop.iter, m, "content") for m in messages):
            _target(loop.target)
            yield loop
        elif isinstance(loop.iter, jinja2.nodes.Name) and (
            loop.iter.name in content_params.get(id(loop), ())
            or (id(loop) not in in_macros and loop.iter.name == "content")
        ):
            _target(loop.target)
            yield loop
