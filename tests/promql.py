"""The series a PromQL expression reads: enough of PromQL's lexis to find every selector
(a metric name and its label matchers) in the alert rules and the dashboard, so that a test
can check each against what the product's /metrics exports. Not a parser: whether an
expression is valid PromQL is for promtool and a real Prometheus to say."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: Words followed by a parenthesised list of label names, not of series.
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
#: Operators, modifiers and aggregations (which may precede ``by (...)``) spelled as words.
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"} | {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile",
}  # fmt: skip

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<variable>\$\{?\w+\}?)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:[smhdwy]|ms)*)
  | (?P<name>[A-Za-z_:][\w:]*)
  | (?P<braces>\{)
  | (?P<brackets>\[[^\]]*\])
  | (?P<other>.)
    """,
    re.VERBOSE,
)
_MATCHER = re.compile(
    r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')\s*,?'
)


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str


@dataclass
class Selector:
    #: The metric name ("" for a selector by its matchers alone).
    name: str
    matchers: list[Matcher] = field(default_factory=list)


def _matchers(text: str, start: int) -> tuple[list[Matcher], int]:
    """The label matchers of a ``{...}`` opening at ``start``, and where it closes."""
    found: list[Matcher] = []
    at = start + 1
    while True:
        while at < len(text) and text[at] in " \t\n,":
            at += 1
        if at < len(text) and text[at] == "}":
            return found, at + 1
        matched = _MATCHER.match(text, at)
        if matched is None:
            raise ValueError(f"cannot read the label matchers at {text[at : at + 30]!r}")
        label, op, quoted = matched.groups()
        found.append(Matcher(label, op, quoted[1:-1].encode().decode("unicode_escape")))
        at = matched.end()


def selectors(expression: str) -> list[Selector]:
    """Every series selector in ``expression``, in order."""
    found: list[Selector] = []
    at = 0
    named: Selector | None = None  # a metric name just read: its label matchers may follow
    label_list = False  # a word just read that a list of label names follows
    while at < len(expression):
        token = _TOKEN.match(expression, at)
        assert token is not None  # "other" matches any character
        kind, text = token.lastgroup, token.group()
        if kind == "space":
            at = token.end()
            continue
        if kind == "braces":
            matchers, at = _matchers(expression, at)
            if named is not None:
                named.matchers = matchers
            else:
                found.append(Selector("", matchers))
            named, label_list = None, False
            continue
        at = token.end()
        named = None
        if label_list:
            label_list = False
            if text == "(":
                at = expression.index(")", at) + 1
                continue
        if kind == "name":
            if text in _LABEL_LISTS:
                label_list = True
            elif not expression[at:].lstrip().startswith("(") and text.lower() not in _KEYWORDS:
                named = Selector(text)  # not a function, an aggregation or an operator
                found.append(named)
    return found


def names(expression: str) -> set[str]:
    """The metric names ``expression`` reads (from ``__name__`` matchers too, when equal)."""
    out: set[str] = set()
    for selector in selectors(expression):
        if selector.name:
            out.add(selector.name)
        out.update(m.value for m in selector.matchers if m.label == "__name__" and m.op == "=")
    return out
