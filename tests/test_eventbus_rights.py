"""What a key may publish and receive on the Event BUS (bus.eventbus.rights), as properties:
a narrowed subscription or snapshot never reaches past the key's subtrees, and loses nothing
inside them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bus.eventbus import rights
from bus.eventbus.codec import PROBE_SUBTREE

segment = st.text(alphabet="abc", min_size=1, max_size=2)
subtree = st.lists(segment, min_size=1, max_size=3).map(lambda p: "/" + "/".join(p) + "/")
topic = st.lists(segment, min_size=1, max_size=4).map(lambda p: "/" + "/".join(p) + "/")
prefix = st.one_of(st.just(""), st.just("/"), subtree, topic.map(lambda t: t[:-1]))


def test_metadata_entries() -> None:
    assert rights.subtrees({}, "publish") is None
    assert rights.subtrees({"publish": "/a/, /b/"}, "publish") == (b"/a/", b"/b/")
    assert rights.subtrees({"publish": ""}, "publish") == ()
    assert rights.may_publish(b"/a/x/", (b"/a/",))
    assert not rights.may_publish(b"/ab/", (b"/a/",))
    assert not rights.may_publish(b"/a/", ())
    assert rights.may_publish(b"/anything/", None)


@given(st.lists(subtree, max_size=3), prefix, topic)
def test_a_narrowed_subscription_matches_exactly_the_allowed_topics_it_wanted(
    allowed: list[str], wanted: str, candidate: str
) -> None:
    granted = tuple(s.encode() for s in allowed)
    prefixes = rights.narrow(wanted.encode(), granted)
    receives = any(candidate.encode().startswith(p) for p in prefixes)
    should = candidate.startswith(wanted) and candidate.encode().startswith(granted)
    assert receives == should


@given(st.lists(subtree, max_size=3), prefix)
def test_server_topics_reach_every_subscriber_that_asked_for_them(
    allowed: list[str], wanted: str
) -> None:
    prefixes = rights.narrow(wanted.encode(), tuple(s.encode() for s in allowed))
    assert any(b"$heartbeat".startswith(p) for p in prefixes) == (wanted == "")


@given(st.lists(subtree, max_size=3), st.lists(subtree, max_size=3), topic)
def test_a_narrowed_snapshot_holds_exactly_the_allowed_topics_it_asked_for(
    allowed: list[str], wanted: list[str], candidate: str
) -> None:
    granted = tuple(s.encode() for s in allowed)
    asked = tuple(s.encode() for s in wanted)
    narrowed = rights.narrow_snapshot(asked, granted)
    assert narrowed  # never empty: empty would mean everything
    holds = candidate.encode().startswith(narrowed)
    asked_for = not asked or candidate.encode().startswith(asked)
    assert holds == (asked_for and candidate.encode().startswith(granted))


def test_a_snapshot_outside_every_subtree_is_the_probe() -> None:
    assert rights.narrow_snapshot((b"/b/",), (b"/a/",)) == (PROBE_SUBTREE,)
    assert rights.narrow_snapshot((), None) == ()
