"""Topics as NATS subjects (bus.eventbus.subjects): every topic the protocol allows has a
valid subject and comes back from it; a subtree's filter matches every topic under it,
and only those when it says it is exact. The matcher below is NATS's token rule."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.eventbus import subjects

PREFIX = "eventbus"
# NATS: tokens are non-empty and hold no ".", "*", ">" or whitespace.
TOKEN = re.compile(r"[^.*>\s]+")


def matches(filter_: str, subject: str) -> bool:
    pattern, tokens = filter_.split("."), subject.split(".")
    for index, part in enumerate(pattern):
        if part == ">":
            return len(tokens) > index
        if index >= len(tokens) or (part != "*" and part != tokens[index]):
            return False
    return len(tokens) == len(pattern)


topics = st.one_of(
    st.text(min_size=1, max_size=40).map(lambda t: t.encode("utf-8")),
    st.lists(st.sampled_from(["", "a", "orders", ".", "*", ">", " ", "~", "é", "~2E"]))
    .map(lambda parts: "/".join(parts).encode("utf-8"))
    .filter(bool),
)


@settings(max_examples=500)
@given(topics)
def test_every_topic_has_a_valid_subject_and_comes_back(topic: bytes) -> None:
    subject = subjects.subject(PREFIX, topic)
    assert all(TOKEN.fullmatch(token) for token in subject.split("."))
    assert subjects.topic(PREFIX, subject) == topic


@settings(max_examples=500)
@given(topics, topics, st.integers(0, 40))
def test_a_subtree_filter_matches_what_is_under_it_and_exactly_when_it_says(
    topic: bytes, other: bytes, cut: int
) -> None:
    subtree = topic[:cut]
    filter_ = subjects.subtree_filter(PREFIX, subtree)
    assert matches(filter_, subjects.subject(PREFIX, topic))  # topic starts with subtree
    if subjects.covers(subtree):
        assert matches(filter_, subjects.subject(PREFIX, other)) == other.startswith(subtree)


def test_examples_from_the_docs() -> None:
    assert subjects.subject(PREFIX, b"/orders/7/") == "eventbus.~.orders.7.~"
    assert subjects.subject(PREFIX, "a.b é".encode()) == "eventbus.a~2Eb~20~C3~A9"
    assert subjects.subtree_filter(PREFIX, b"/orders/") == "eventbus.~.orders.>"
    assert subjects.subtree_filter(PREFIX, b"/ord") == "eventbus.~.>"
    assert subjects.filters(PREFIX, [b"/orders/", b"/", b"/orders/7/"]) == (["eventbus.~.>"], True)
    assert subjects.filters(PREFIX, [b"/a/", b"/b"]) == (["eventbus.~.>"], False)
    assert subjects.filters(PREFIX, [b"/a/", b"/b/x/"]) == (
        ["eventbus.~.a.>", "eventbus.~.b.x.>"],
        True,
    )
    assert subjects.filters(PREFIX, [b"/a/", b""]) == (["eventbus.>"], True)


@pytest.mark.parametrize(
    "subject", ["other.~", "eventbus.a~2", "eventbus.a~zz", "eventbus.a b", "eventbus.a*"]
)
def test_subjects_it_never_makes_are_refused(subject: str) -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.topic(PREFIX, subject)
