"""The chat template's sandbox, bounded by ``limits.render_chars``.

transformers renders in Jinja's ``ImmutableSandboxedEnvironment``, which keeps a template from
Python's internals but not from memory: ``{{ 'x' * 10**9 }}`` takes gigabytes. ``BoundedSandbox``
is that environment (transformers' filters, globals and extensions) with the operations that can
build large values checked:

- before they run, where the size of the result follows from the operands: ``*``, ``**``, ``+``,
  ``%``, ``~``, the padding, repeating and joining filters and ``str`` methods, ``lipsum``,
  ``strftime``; a result larger than ``render_chars`` is refused before it is made;
- after they run, every value a filter, call or operator returns, and every text printed: no
  value may be larger than ``render_chars``, and one render may build no more than
  ``BUILD_FACTOR`` times ``render_chars`` characters in all (what it prints into a block, a macro
  or a filter included), which bounds what a lazy sequence can make.

``RenderLimitError`` says which bound was reached; ``TemplateFailure`` carries any other exception
out of a render (an overflow, a recursion, a missing loader). Both are ``jinja2.TemplateError``s,
so the chat formats name the conversation whose render failed as they do for a template's own
errors.
"""

from __future__ import annotations

import re
from itertools import chain, islice
from types import BuiltinMethodType, MethodType

import jinja2
from jinja2.compiler import CodeGenerator, optimizeconst
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum

# a render may build this many times render_chars in all (its values and what it prints)
BUILD_FACTOR = 16
_DIGITS = re.compile(r"\d+")
# a printf field's flags, width and precision ('%-10.3f'); a format field's spec ('{:>10}')
_PRINTF_FIELD = re.compile(r"%(?:\([^)]*\))?([-#0 +]*[0-9]*(?:\.[0-9]*)?)")
_FORMAT_SPEC = re.compile(r"\{[^{}:]*:([^{}]*)")
# a replacement field inside another: its value is a width
_NESTED_FIELD = re.compile(r"\{[^{}]*\{")
# the bits of an int per decimal digit (3.32), rounded down: its digits counted high
_BITS_PER_DIGIT = 3
_CONTAINERS = (list, tuple, dict, set, frozenset)
_SIZED = (str, bytes, *_CONTAINERS)
# measured item by item
_MEASURED = (*_CONTAINERS, Namespace)
# plain data nested deeper is measured item by item
_PLAIN_DEPTH = 64
# what a dict has as attributes (its methods): any other name of ``message.name`` is an item
_DICT_ATTRIBUTES = frozenset(dir(dict))
# the types whose attributes Jinja's sandbox allows or refuses by the type and the name alone
# (``is_safe_attribute``: none of them is a function, method, class, frame or generator, and
# whether one is a mutable container follows from the type); a namespace's too
_DECIDED_BY_TYPE = frozenset({str, dict, list, tuple, int, float, LoopContext})
# the values Jinja's sandbox replaces as they are read: ``str.format`` and ``format_map``
_METHODS = (MethodType, BuiltinMethodType)
_WRAPPED = frozenset({"format", "format_map"})


class RenderLimitError(jinja2.TemplateError):
    """A render would print or build more than ``limits.render_chars`` allows."""


class TemplateFailure(jinja2.TemplateError):
    """An exception other than a template error, out of a render."""


def text_size(value, limit: int) -> int:
    """About the length of ``str(value)``, counted up to just past ``limit``.

    Strings count their characters, containers their items' sizes, each item a few characters
    more (a container inside itself, as ``str`` prints it, a few); the count stops once it
    passes ``limit``, so a value of any size is measured in bounded time.
    """
    try:
        return _plain_size(value, limit, 0)
    except _Unmeasured:
        pass
    total, pending, inside = 0, [value], set()
    while pending and total <= limit:
        item = pending.pop()
        # by type: isinstance would ask a Namespace for its __class__, slowly
        kind = type(item)
        if kind is str:
            # the common case, first
            total += len(item) + 2
        elif kind is _Leaving:
            inside.discard(item.key)
        elif issubclass(kind, (str, bytes)):
            total += len(item) + 2
        elif kind is bool or item is None:
            total += 5
        elif issubclass(kind, int):
            total += item.bit_length() // _BITS_PER_DIGIT + 2
        elif issubclass(kind, _MEASURED):
            total += 5
            if id(item) not in inside:
                total += _open(item, pending, inside, limit)
        else:
            total += 64
    return total


class _Unmeasured(Exception):
    """``_plain_size`` leaves the value to ``text_size``'s own count."""


def _plain_size(value, limit: int, depth: int) -> int:
    """``text_size`` of plain data (exact dicts, lists, strings, numbers), the common case.

    Counted as ``text_size`` counts, recursively; ``_Unmeasured`` for any other type, past
    ``limit`` (``text_size`` then says how far it counted) or nested deeper than
    ``_PLAIN_DEPTH`` (a container inside itself). Either way the work is bounded by ``limit``.
    """
    kind = type(value)
    if kind is str:
        return len(value) + 2
    if kind is dict or kind is list:
        if depth > _PLAIN_DEPTH:
            raise _Unmeasured
        total = 5
        for item in chain.from_iterable(value.items()) if kind is dict else value:
            total += len(item) + 2 if type(item) is str else _plain_size(item, limit, depth + 1)
            if total > limit:
                raise _Unmeasured
        return total
    if kind is bool or value is None:
        return 5
    if kind is int:
        return value.bit_length() // _BITS_PER_DIGIT + 2
    if kind is float:
        return 64
    raise _Unmeasured


def _open(container, pending: list, inside: set, limit: int) -> int:
    """The size of ``container``'s strings; its other items (up to ``limit``) left ``pending``.

    While they are, it is ``inside``, so that reaching it again among them counts a few
    characters, as ``str`` prints a container inside itself.
    """
    size, start = 0, len(pending)
    for child in islice(_items(container), limit):
        if type(child) is str:
            # the common case, measured at once
            size += len(child) + 2
        else:
            pending.append(child)
    if len(pending) > start:
        inside.add(id(container))
        pending.insert(start, _Leaving(id(container)))
    return size


class _Leaving:
    """``text_size``'s mark that it has measured the container of id ``key``."""

    __slots__ = ("key",)

    def __init__(self, key: int):
        self.key = key


def _items(container):
    """What ``str(container)`` prints: its items, a mapping's keys and values."""
    kind = type(container)
    if kind is not dict and issubclass(kind, Namespace):
        container = container._Namespace__attrs
    if kind is dict or issubclass(type(container), dict):
        return chain.from_iterable(container.items())
    return container


def _length(value) -> int:
    """The characters, items or (about) digits of a value, without looking inside it."""
    if issubclass(type(value), _SIZED):
        return len(value)
    if type(value) is int:
        return value.bit_length() // _BITS_PER_DIGIT
    return 0


def _number(value) -> int:
    """An int argument as a count, 0 for anything else (the call then fails on its own)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _widths(text, spec: re.Pattern) -> int:
    """The sum of the widths and precisions of a format string's fields (``spec`` finds them)."""
    if not isinstance(text, str):
        return 0
    return sum(
        int(d) if len(d) < 10 else 10**10
        for field in spec.findall(text)
        for d in _DIGITS.findall(field)
    )


class _CodeGenerator(CodeGenerator):
    """Jinja's code generator, with ``~`` and every block's buffer bounded.

    A dict's item read as an attribute, and a printed string, are written in place of the
    environment's calls that return them.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the names the printed values being written are held in (innermost last)
        self._printing: list[str] = []

    def buffer(self, frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.output_buffer()")

    @optimizeconst
    def visit_Concat(self, node, frame) -> None:
        # as Jinja's, the parts measured by the environment before they are joined
        if frame.eval_ctx.volatile:
            func_name = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            func_name = "markup_join"
        else:
            func_name = "str_join"
        self.write(f"environment.concat_checked({func_name}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    @optimizeconst
    def visit_Getattr(self, node, frame) -> None:
        # a dict's item, where a dict has no attribute of that name, read in place: what
        # ``BoundedSandbox.getattr`` returns for it (anything else goes to it)
        if self.environment.is_async or node.attr in _DICT_ATTRIBUTES:
            super().visit_Getattr(node, frame)
            return
        held, attr = self.temporary_identifier(), repr(node.attr)
        self.write(f"({held}[{attr}] if type({held} := ")
        self.visit(node.node, frame)
        self.write(f") is dict and {attr} in {held} else environment.getattr({held}, {attr}))")

    def _output_child_pre(self, node, frame, finalize) -> None:
        # a printed string is its own text (``str(finalize(text))`` is ``text``): it is printed
        # without the calls
        if not self._plain_output(frame, finalize):
            super()._output_child_pre(node, frame, finalize)
            return
        self._printing.append(self.temporary_identifier())
        self.write(f"({self._printing[-1]} if type({self._printing[-1]} := ")

    def _output_child_post(self, node, frame, finalize) -> None:
        if not self._plain_output(frame, finalize):
            super()._output_child_post(node, frame, finalize)
            return
        held = self._printing.pop()
        self.write(f") is str else str({finalize.src}{held})))")

    @staticmethod
    def _plain_output(frame, finalize) -> bool:
        """Whether printed values go through ``str(environment.finalize(value))`` alone."""
        return finalize.src == "environment.finalize(" and not (
            frame.eval_ctx.volatile or frame.eval_ctx.autoescape
        )


class _Buffer(list):
    """A block's output (a macro's, a filter block's, a ``set`` block's), counted as it grows.

    The block's text becomes a value: it may not be larger than render_chars.
    """

    __slots__ = ("environment", "size")

    def __init__(self, environment: BoundedSandbox):
        super().__init__()
        self.environment = environment
        self.size = 0

    def append(self, text) -> None:
        size = len(text) if type(text) is str else _length(text)
        self.size += size
        if self.size > self.environment.render_chars:
            self.environment.refuse_beyond(self.size, "a block of the template")
        self.environment.spend(size)
        super().append(text)

    def extend(self, texts) -> None:
        for text in texts:
            self.append(text)


class _NoOtherTemplates(jinja2.BaseLoader):
    """A chat template is one file: it cannot include, import or extend another."""

    def get_source(self, environment, template):
        raise jinja2.TemplateNotFound(
            template,
            f"a chat template cannot include, import or extend another template ({template!r})",
        )


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """transformers' template sandbox, refusing values beyond ``render_chars``.

    ``begin()`` starts a render's count; ``print_into`` counts what it prints. It counts one
    render at a time: a renderer is not shared between threads.
    """

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, base: jinja2.Environment, render_chars: int):
        super().__init__(
            trim_blocks=base.trim_blocks,
            lstrip_blocks=base.lstrip_blocks,
            keep_trailing_newline=base.keep_trailing_newline,
            extensions=[type(extension) for extension in base.extensions.values()],
            finalize=self._finalize,
            loader=_NoOtherTemplates(),
        )
        self.render_chars = render_chars
        self.filters.update(base.filters)
        self.globals.update(base.globals)
        self.filters = {name: self._bounded(name, f) for name, f in self.filters.items()}
        # (type, attribute) -> whether Jinja's sandbox allows it, for the types it decides by
        # type; the attributes are names in the template, so this stays as small as it is
        self._allowed: dict[tuple[type, str], bool] = {}
        # plain data a renderer rebuilt and holds (``hold``): id -> [the value, its text_size
        # and its plain ``tojson`` text, each None until first asked for]
        self._held: dict[int, list] = {}
        self.begin()

    def begin(self) -> None:
        """Start counting a new render."""
        self.built = 0

    def hold(self, values, fresh: bool = False) -> None:
        """Measure each of ``values`` once, and print its plain ``tojson`` once.

        They are plain data a renderer rebuilt for its renders (a tool list's tools), which
        nothing changes (the sandbox is immutable); each is held, so its id is never reused.
        ``fresh``: forget those held before.
        """
        if fresh:
            self._held = {}
        for value in values:
            self._held[id(value)] = [value, None, None]

    def size_of(self, value) -> int:
        """``text_size(value, render_chars)``, measured once for a held value."""
        held = self._held.get(id(value))
        if held is None:
            return text_size(value, self.render_chars)
        if held[1] is None:
            held[1] = text_size(value, self.render_chars)
        return held[1]

    def print_into(self, blocks: list, texts) -> None:
        """Append ``texts``, the pieces a render prints, to ``blocks``.

        Refused once they pass render_chars in all.
        """
        size, limit, append = 0, self.render_chars, blocks.append
        for text in texts:
            size += len(text)
            if size > limit:
                raise RenderLimitError(
                    f"the render prints more than limits.render_chars ({limit:,}) characters"
                )
            append(text)

    def spend(self, size: int) -> None:
        """Count ``size`` characters built by the render."""
        self.built += size
        if self.built > BUILD_FACTOR * self.render_chars:
            raise RenderLimitError(
                f"the render builds more than {BUILD_FACTOR} × limits.render_chars "
                f"({self.render_chars:,}) characters in all"
            )

    def refuse_beyond(self, size: int, what: str) -> None:
        """Refuse to make ``what``, of about ``size`` characters, beyond render_chars."""
        if size > self.render_chars:
            raise RenderLimitError(
                f"{what} would make about {size:,} characters, more than limits.render_chars "
                f"({self.render_chars:,})"
            )

    def checked(self, value, what: str):
        """``value``, counted; refused where it is larger than render_chars."""
        if type(value) is str:
            # the common case, first
            size = len(value)
            if size > self.render_chars:
                self.refuse_beyond(size, what)
            self.spend(size)
            return value
        size = _length(value)
        if issubclass(type(value), _MEASURED):
            self.refuse_beyond(text_size(value, self.render_chars), what)
        self.refuse_beyond(size, what)
        self.spend(size)
        return value

    def getattr(self, obj, attribute):
        """``obj.attribute`` as Jinja's sandbox reads it, its common cases first.

        A dict's item where a dict has no attribute of that name (``message.content``: Jinja tries
        the attribute, then the item); an attribute of a type in ``_DECIDED_BY_TYPE`` or of a
        namespace that the sandbox allowed once, whose value it passes as it is (not
        ``str.format``). Anything else goes through Jinja's own checks.
        """
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        if (kind in _DECIDED_BY_TYPE or issubclass(kind, Namespace)) and type(attribute) is str:
            allowed = self._allowed.get((kind, attribute))
            if allowed is None:
                allowed = self._allowed[kind, attribute] = self.is_safe_attribute(
                    obj, attribute, None
                )
            if allowed:
                try:
                    value = getattr(obj, attribute)
                except AttributeError:
                    return super().getattr(obj, attribute)
                if type(value) not in _METHODS or value.__name__ not in _WRAPPED:
                    return value
        return super().getattr(obj, attribute)

    def output_buffer(self) -> _Buffer:
        return _Buffer(self)

    def _finalize(self, value):
        if type(value) is not str:
            self.refuse_beyond(text_size(value, self.render_chars), "printing a value")
        return value

    def concat_checked(self, join, parts: tuple) -> str:
        self.refuse_beyond(sum(text_size(p, self.render_chars) for p in parts), "'~'")
        return self.checked(join(parts), "'~'")

    def call_binop(self, context, operator: str, left, right):
        if operator == "+" and type(left) is str and type(right) is str:
            # the common case, first: the result's size is known before it is made
            size = len(left) + len(right)
            if size > self.render_chars:
                self.refuse_beyond(size, "'+'")
            self.spend(size)
            return left + right
        self.refuse_beyond(_binop_size(operator, left, right, self.render_chars), f"{operator!r}")
        return self.checked(super().call_binop(context, operator, left, right), f"{operator!r}")

    def call(__self, __context, __obj, *args, **kwargs):
        if _may_build(__obj):
            size = _call_size(__obj, args, kwargs, __self.render_chars)
            if size > __self.render_chars:
                __self.refuse_beyond(size, _call_name(__obj))
        if (
            type(__obj) is BuiltinMethodType
            and type(__obj.__self__) is str
            and __obj.__name__ not in _WRAPPED
        ):
            # a string's method (``content.startswith(...)``): what Jinja's checks and its
            # context's call come to for it, the call with the loop's and block's names left out
            kwargs.pop("_block_vars", None)
            kwargs.pop("_loop_vars", None)
            value = __obj(*args, **kwargs)
        else:
            value = super().call(__context, __obj, *args, **kwargs)
        if type(value) is str and len(value) <= __self.render_chars:
            # the common case (a macro's text, a string method's), first
            __self.spend(len(value))
            return value
        return __self.checked(value, _call_name(__obj))

    def _bounded(self, name: str, function):
        """Filter ``name``, refused beyond render_chars before and after it runs."""
        size, what = _FILTER_SIZES.get(name), f"the filter {name!r}"
        if name == "tojson":
            function = self._printed_once(function)

        def bounded(*args, **kwargs):
            if size is not None:
                self.refuse_beyond(_sized(size, self, args, kwargs), what)
            return self.checked(function(*args, **kwargs), what)

        bounded.__dict__.update(getattr(function, "__dict__", {}))
        bounded.__wrapped__ = function
        return bounded

    def _printed_once(self, tojson):
        """``tojson``, its text of a held value (with no options) made once."""

        def printed(value, *args, **kwargs):
            held = None if args or kwargs else self._held.get(id(value))
            if held is None:
                return tojson(value, *args, **kwargs)
            if held[2] is None:
                held[2] = tojson(value)
            return held[2]

        printed.__dict__.update(getattr(tojson, "__dict__", {}))
        printed.__wrapped__ = tojson
        return printed


def _sized(size, env: BoundedSandbox, args: tuple, kwargs: dict) -> int:
    """``size`` of a filter call; 0 where its arguments are wrong (the filter then says so)."""
    try:
        return size(env, args, kwargs)
    except (TypeError, ValueError, IndexError):
        return 0


def _call_name(obj) -> str:
    return getattr(getattr(obj, "__wrapped__", obj), "__name__", "a call")


def _binop_size(operator: str, left, right, limit: int) -> int:
    """The size of ``left operator right``'s result, where it can be large; 0 otherwise."""
    if operator == "*":
        if isinstance(right, (str, bytes, list, tuple)):
            left, right = right, left
        if isinstance(left, (str, bytes, list, tuple)):
            return len(left) * max(_number(right), 0)
        return _length(left) + _length(right)
    if operator == "**" and isinstance(left, int) and isinstance(right, int):
        return left.bit_length() * max(right, 0) // _BITS_PER_DIGIT if abs(left) > 1 else 0
    if operator == "+":
        return _length(left) + _length(right)
    if operator == "%" and isinstance(left, (str, bytes)):
        args = right if isinstance(right, tuple) else (right,)
        stars = sum(abs(_number(a)) for a in args) if b"*" in _ascii(left) else 0
        return len(left) + _widths(_text(left), _PRINTF_FIELD) + stars + text_size(args, limit)
    return 0


def _ascii(text) -> bytes:
    return text.encode("utf-8", "replace") if isinstance(text, str) else text


def _text(text) -> str:
    return text if isinstance(text, str) else text.decode("latin-1")


# str and bytes methods whose result can be larger than the string by an argument's choosing
_PADDING = frozenset({"center", "ljust", "rjust", "zfill"})
_SIZED_CALLS = _PADDING | {
    "expandtabs",
    "replace",
    "format",
    "format_map",
    "join",
    "strftime",
    "strftime_now",
    "translate",
}


def _may_build(obj) -> bool:
    """Whether a call of ``obj`` can build a large value that ``_call_size`` foresees.

    Not a macro (its text is measured as it is built), nor a builtin method (a str's, a dict's:
    the common case; it cannot be wrapped) other than those ``_SIZED_CALLS`` names.
    """
    kind = type(obj)
    if kind is Macro:
        return False
    return kind is not BuiltinMethodType or obj.__name__ in _SIZED_CALLS


def _call_size(obj, args: tuple, kwargs: dict, limit: int) -> int:
    """The size of the result of a call that can build a large value; 0 otherwise."""
    target = getattr(obj, "__wrapped__", obj)
    name = getattr(target, "__name__", "")
    if name not in _SIZED_CALLS and target is not generate_lorem_ipsum:
        return 0
    owner = getattr(target, "__self__", None)
    values = (*args, *kwargs.values())
    if isinstance(owner, (str, bytes)):
        if name in _PADDING:
            return max(len(owner), _number(values[0]) if values else 0)
        if name == "expandtabs":
            tab = _number(values[0]) if values else 8
            return len(owner) + _ascii(owner).count(b"\t") * tab
        if name == "replace" and len(values) >= 2:
            return _replaced_size(owner, *values[:3])
        if name in ("format", "format_map"):
            return (
                len(owner)
                + _widths(_text(owner), _FORMAT_SPEC)
                + text_size(values, limit)
                # a width given by an argument: '{:{}}'
                + (
                    sum(abs(_number(v)) for v in values)
                    if _NESTED_FIELD.search(_text(owner))
                    else 0
                )
            )
        if name == "join" and values:
            return _joined_size(owner, values[0], limit)
        if name == "translate" and values and isinstance(values[0], dict):
            longest = max((len(v) for v in values[0].values() if isinstance(v, str)), default=1)
            return len(owner) * longest
    if target is generate_lorem_ipsum:
        count, *_ = (*args, kwargs.get("n", 5))
        return _number(count) * 100 * 12
    if name in ("strftime", "strftime_now") and values:
        return 256 * len(values[0]) if isinstance(values[0], str) else 0
    return 0


def _replaced_size(text, old, new, count=-1) -> int:
    if not isinstance(old, type(text)) or not isinstance(new, type(text)):
        return 0
    found = len(text) + 1 if not old else text.count(old)
    if _number(count) >= 0 and count not in (-1, None):
        found = min(found, _number(count))
    return len(text) + found * len(new)


def _joined_size(separator, items, limit: int) -> int:
    if not isinstance(items, (list, tuple)):
        return 0
    return text_size(items, limit) + len(separator) * len(items)


def _center(env, args, kwargs) -> int:
    value, width = (*args, kwargs.get("width", 80))[:2]
    return max(len(str(value)), _number(width))


def _indent(env, args, kwargs) -> int:
    text, width = (*args, kwargs.get("width", 4))[:2]
    text = str(text)
    step = len(width) if isinstance(width, str) else _number(width)
    return len(text) + (text.count("\n") + 1) * step


def _replace(env, args, kwargs) -> int:
    # do_replace(eval_ctx, s, old, new, count=None)
    _, text, old, new, *rest = (*args, *kwargs.values())
    return _replaced_size(str(text), str(old), str(new), rest[0] if rest else -1)


def _join(env, args, kwargs) -> int:
    # do_join(eval_ctx, value, d="", attribute=None)
    _, items, *rest = args
    separator = rest[0] if rest else kwargs.get("d", "")
    return _joined_size(str(separator), items, env.render_chars)


def _format(env, args, kwargs) -> int:
    text, *values = args
    return _binop_size("%", str(text), (*values, *kwargs.values()), env.render_chars)


def _wordwrap(env, args, kwargs) -> int:
    # do_wordwrap(environment, s, width=79, break_long_words=True, wrapstring=None, ...)
    text = str(args[1])
    wrap = kwargs.get("wrapstring", args[4] if len(args) > 4 else None) or "\n"
    return len(text) * (1 + len(str(wrap)))


def _tojson(env, args, kwargs) -> int:
    value, *rest = args
    indent = kwargs.get("indent", rest[1] if len(rest) > 1 else None)
    step = len(indent) if isinstance(indent, str) else _number(indent)
    return env.size_of(value) * (2 + step)


def _sequence_filler(position: int, keyword: str):
    def size(env, args, kwargs) -> int:
        return _number(kwargs.get(keyword, args[position] if len(args) > position else 0))

    return size


_FILTER_SIZES = {
    "center": _center,
    "indent": _indent,
    "replace": _replace,
    "join": _join,
    "format": _format,
    "wordwrap": _wordwrap,
    "tojson": _tojson,
    # do_batch(value, linecount, fill_with=None), do_slice(value, slices, fill_with=None)
    "batch": _sequence_filler(1, "linecount"),
    "slice": _sequence_filler(1, "slices"),
}
