"""Argo's ``when`` conditions: the govaluate subset Argo evaluates once variables are substituted.

Bare words are strings (Argo turns govaluate's variables into strings, so ``heads == heads`` holds),
numbers compare as numbers, quoted strings may use ``'`` or ``"``. Operators: ``== != < <= > >= =~ !~``,
``&& || !``, unary ``-``, parentheses, ``true`` and ``false``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["WhenError", "evaluate_when"]


class WhenError(ValueError):
    """A ``when`` condition that cannot be evaluated; the message is Argo's."""


@dataclass(frozen=True)
class _Token:
    kind: str  # num, str, bool, op, lparen, rparen
    value: Any


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![A-Za-z_]))
      | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
      | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
      | (?P<op>&&|\|\||==|!=|>=|<=|=~|!~|>|<|!|-)
      | (?P<lparen>\()
      | (?P<rparen>\))
    )""",
    re.X,
)


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


def _tokenize(text: str, original: str) -> list[_Token]:
    tokens: list[_Token] = []
    position = 0
    stripped = text.rstrip()
    while position < len(stripped):
        match = _TOKEN.match(stripped, position)
        if match is None or match.end() == position:
            bad = stripped[position:].strip()[:1]
            raise WhenError(
                f"Invalid 'when' expression '{original}': Invalid token: '{bad}' "
                '(hint: try wrapping the affected expression in quotes ("))'
            )
        position = match.end()
        if match.group("num") is not None:
            tokens.append(_Token("num", float(match.group("num"))))
        elif match.group("str") is not None:
            tokens.append(_Token("str", _unquote(match.group("str"))))
        elif match.group("word") is not None:
            word = match.group("word")
            if word in ("true", "false"):
                tokens.append(_Token("bool", word == "true"))
            else:
                tokens.append(_Token("str", word))
        elif match.group("op") is not None:
            tokens.append(_Token("op", match.group("op")))
        elif match.group("lparen") is not None:
            tokens.append(_Token("lparen", "("))
        else:
            tokens.append(_Token("rparen", ")"))
    return tokens


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class _Parser:
    def __init__(self, tokens: list[_Token], original: str) -> None:
        self.tokens = tokens
        self.position = 0
        self.original = original

    def fail(self, why: str) -> WhenError:
        return WhenError(f"Invalid 'when' expression '{self.original}': {why}")

    def peek(self) -> _Token | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> _Token:
        token = self.peek()
        if token is None:
            raise self.fail("Unexpected end of expression")
        self.position += 1
        return token

    def parse(self) -> Any:
        if not self.tokens:
            raise self.fail("Unexpected end of expression")
        value = self.or_expr()
        if self.peek() is not None:
            token = self.take()
            raise self.fail(
                f"Cannot transition token types from {token.kind.upper()} [{_show(token.value)}] "
                '(hint: try wrapping the affected expression in quotes ("))'
            )
        return value

    def or_expr(self) -> Any:
        left = self.and_expr()
        while (token := self.peek()) is not None and token.kind == "op" and token.value == "||":
            self.take()
            right = self.and_expr()
            left = self.logical("||", left, right)
        return left

    def and_expr(self) -> Any:
        left = self.comparison()
        while (token := self.peek()) is not None and token.kind == "op" and token.value == "&&":
            self.take()
            right = self.comparison()
            left = self.logical("&&", left, right)
        return left

    def logical(self, op: str, left: Any, right: Any) -> bool:
        for value in (left, right):
            if not isinstance(value, bool):
                raise self.fail(
                    f"Value '{_show(value)}' cannot be used with the logical operator '{op}', "
                    "it is not a bool"
                )
        return bool(left and right) if op == "&&" else bool(left or right)

    def comparison(self) -> Any:
        left = self.unary()
        token = self.peek()
        if (
            token is not None
            and token.kind == "op"
            and token.value in ("==", "!=", "<", "<=", ">", ">=", "=~", "!~")
        ):
            self.take()
            right = self.unary()
            return self.compare(token.value, left, right)
        return left

    def compare(self, op: str, left: Any, right: Any) -> bool:
        if op in ("==", "!="):
            same = type(left) is type(right) and left == right
            return same if op == "==" else not same
        if op in ("=~", "!~"):
            if not isinstance(left, str) or not isinstance(right, str):
                raise self.fail(
                    f"Value '{_show(right)}' cannot be used with the comparator '{op}', it is not a string"
                )
            try:
                found = re.search(right, left) is not None
            except re.error as exc:
                raise self.fail(f"invalid regular expression '{right}': {exc}") from exc
            return found if op == "=~" else not found
        both_numbers = isinstance(left, float) and isinstance(right, float)
        both_strings = isinstance(left, str) and isinstance(right, str)
        if not (both_numbers or both_strings):
            culprit = right if isinstance(left, float) else left
            raise self.fail(
                f"Value '{_show(culprit)}' cannot be used with the comparator '{op}', it is not a number"
            )
        return bool({"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[op])

    def unary(self) -> Any:
        token = self.peek()
        if token is not None and token.kind == "op" and token.value == "!":
            self.take()
            value = self.unary()
            if not isinstance(value, bool):
                raise self.fail(
                    f"Value '{_show(value)}' cannot be used with the prefix '!', it is not a bool"
                )
            return not value
        if token is not None and token.kind == "op" and token.value == "-":
            self.take()
            value = self.unary()
            if not isinstance(value, float):
                raise self.fail(
                    f"Value '{_show(value)}' cannot be used with the prefix '-', "
                    'it is not a number (hint: try wrapping the affected expression in quotes ("))'
                )
            return -value
        return self.primary()

    def primary(self) -> Any:
        token = self.take()
        if token.kind in ("num", "str", "bool"):
            return token.value
        if token.kind == "lparen":
            value = self.or_expr()
            closing = self.take()
            if closing.kind != "rparen":
                raise self.fail("Unbalanced parenthesis")
            return value
        raise self.fail(
            f"Cannot transition token types to {token.kind.upper()} [{_show(token.value)}] "
            '(hint: try wrapping the affected expression in quotes ("))'
        )


def evaluate_when(when: str) -> bool:
    """Whether a substituted ``when`` condition holds; raises :class:`WhenError` as Argo would fail."""
    if when.strip() == "":
        return True
    value = _Parser(_tokenize(when, when), when).parse()
    if not isinstance(value, bool):
        raise WhenError(f"Expected boolean evaluation for '{when}'. Got {_show(value)}")
    return value
