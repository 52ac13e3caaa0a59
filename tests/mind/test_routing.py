"""The routing core (`mind.core.routing`): where each request is served, as a table of the cases the
dispatcher used to branch on, and the rules that must hold for every combination of facts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mind.core.routing import Facts, Kind, Route, after_find, after_lookup, decide

K = Kind
R = Route


@pytest.mark.parametrize(
    ("facts", "route"),
    [
        # exec
        (Facts(K.EXEC, here=True), R.HERE),
        (Facts(K.EXEC, refused=True, clustered=True, link_ready=True), R.HERE),  # refused here, answered here
        (Facts(K.EXEC), R.LOOKUP),  # one Mind: the credentials say offline or unknown
        (Facts(K.EXEC, clustered=True, link_ready=True), R.RELAY),
        (Facts(K.EXEC, clustered=True), R.LOOKUP),  # holder not cached: asked of the database
        (Facts(K.EXEC, clustered=True, relayed=True, link_ready=True), R.LOOKUP),  # never a second hop
        # run get / cancel
        (Facts(K.GET, here=True, clustered=True, routed=True), R.HERE),
        (Facts(K.CANCEL, clustered=True, routed=True), R.RELAY),
        (Facts(K.CANCEL, clustered=True), R.ASK_PEERS),
        (Facts(K.GET, clustered=True, history=True), R.ASK_PEERS),  # a live node first, then the history
        (Facts(K.GET, clustered=True, relayed=True, history=True), R.HISTORY),
        (Facts(K.CANCEL, clustered=True, relayed=True, routed=True), R.UNKNOWN),
        (Facts(K.GET, history=True), R.HISTORY),
        (Facts(K.GET), R.UNKNOWN),
        (Facts(K.CANCEL, history=True), R.UNKNOWN),  # an ended run is not cancelled from the history
        # attach
        (Facts(K.ATTACH, clustered=True, routed=True), R.RELAY),
        (Facts(K.ATTACH, clustered=True), R.ASK_PEERS),
        (Facts(K.ATTACH), R.HERE),  # waited for: its Hand may present it
        (Facts(K.ATTACH, clustered=True, relayed=True), R.HERE),
        # a run this connection named, its admission waiting on a lookup: decided again after it
        (Facts(K.CANCEL, admitting=True, clustered=True), R.AFTER_ADMISSION),
        (Facts(K.GET, admitting=True, history=True), R.AFTER_ADMISSION),
        (Facts(K.ATTACH, admitting=True), R.AFTER_ADMISSION),
        (Facts(K.GET, admitting=True, here=True), R.HERE),  # (admitted meanwhile: here first)
        # detach
        (Facts(K.DETACH, clustered=True, routed=True, attached_through_link=True), R.RELAY),
        (Facts(K.DETACH, clustered=True, routed=True), R.HERE),  # another connection: the registry says no
        (Facts(K.DETACH, here=True, clustered=True, routed=True, attached_through_link=True), R.HERE),
    ],
)
def test_each_case_the_dispatcher_branched_on(facts: Facts, route: Route) -> None:
    assert decide(facts) is route


facts = st.builds(
    Facts,
    kind=st.sampled_from(Kind),
    clustered=st.booleans(),
    relayed=st.booleans(),
    here=st.booleans(),
    refused=st.booleans(),
    routed=st.booleans(),
    link_ready=st.booleans(),
    attached_through_link=st.booleans(),
    history=st.booleans(),
    admitting=st.booleans(),
)


@given(facts)
def test_the_rules_hold_for_every_combination(f: Facts) -> None:
    route = decide(f)
    if f.here:  # here first
        assert route is R.HERE
    if f.relayed and f.kind is not K.DETACH:  # one hop at most: a relayed request goes nowhere else
        assert route not in (R.RELAY, R.ASK_PEERS)
    if not f.clustered:  # one Mind has no links and no peers
        assert route not in (R.RELAY, R.ASK_PEERS)
    if route is R.RELAY:  # a link is used only when this node knows it leads to the authority
        assert f.link_ready if f.kind is K.EXEC else f.routed
    if route is R.HISTORY:
        assert f.kind is K.GET and f.history
    if route is R.LOOKUP:
        assert f.kind is K.EXEC
    if route is R.AFTER_ADMISSION:  # only a run being admitted, not here yet, waits for it
        assert f.admitting and not f.here and f.kind in (K.GET, K.CANCEL, K.ATTACH)
    if f.kind is K.DETACH:  # a detach needs nobody's answer: here, or through the attached link
        assert route in (R.HERE, R.RELAY) and (route is R.HERE or f.attached_through_link)


@given(st.sampled_from([K.GET, K.CANCEL, K.ATTACH]), st.booleans(), st.booleans(), st.booleans())
def test_after_the_peers_answered(kind: Kind, found: bool, here: bool, history: bool) -> None:
    route = after_find(kind, found, here, history)
    if found:
        assert route is R.RELAY  # the live node holding it is its authority
    elif kind is K.ATTACH or here:
        assert route is R.HERE
    elif kind is K.GET and history:
        assert route is R.HISTORY
    else:
        assert route is R.UNKNOWN


@given(st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_after_an_execs_lookup(holder: bool, client_here: bool, hand_here: bool, relayed: bool) -> None:
    """Relayed only to a holder, for a client still here, when the Hand did not connect here
    meanwhile, and never a request another node relayed here."""
    route = after_lookup(holder, client_here, hand_here, relayed)
    assert (route is R.RELAY) == (holder and client_here and not hand_here and not relayed)
