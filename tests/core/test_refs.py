"""Pod and container references: parse, format, resolve, and every malformed shape."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core.refs import ContainerRef, PodRef, RefError

label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)


def test_parse_and_format() -> None:
    ref = ContainerRef.parse("team-a/dev-0/main")
    assert (ref.namespace, ref.pod, ref.name) == ("team-a", "dev-0", "main")
    assert ref.format() == str(ref) == "team-a/dev-0/main"
    assert ref.pod_ref == PodRef("team-a", "dev-0")
    rel = ContainerRef.parse("_/shadow-1/main")
    assert rel.is_relative and rel.namespace is None and rel.format() == "_/shadow-1/main"
    assert rel.resolve("spot") == ContainerRef("spot", "shadow-1", "main")
    assert ref.resolve("other") is ref
    assert PodRef.parse("_/p.q").resolve("ns") == PodRef("ns", "p.q")
    assert PodRef("ns", "p").container("c") == ref.__class__("ns", "p", "c")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("ns/pod", "must have the form 'namespace/pod/container'"),
        ("a/b/c/d", "must have the form"),
        ("/pod/c", "namespace in reference '/pod/c' is empty"),
        ("Ns/pod/c", "namespace 'Ns' in reference 'Ns/pod/c' is not a DNS-1123 label"),
        ("ns//c", "pod name in reference 'ns//c' is empty"),
        ("ns/Pod/c", "pod name 'Pod'"),
        ("ns/pod/", "container name in reference 'ns/pod/' is empty"),
        ("ns/pod/c.d", "container name 'c.d'"),
        ("ns/pod/" + "c" * 64, "is 64 characters; at most 63 allowed"),
        ("ns/" + "p" * 254 + "/c", "is 254 characters; at most 253 allowed"),
        (5, "must be a string, got int"),
    ],
)
def test_container_ref_errors(text: object, fragment: str) -> None:
    with pytest.raises(RefError) as info:
        ContainerRef.parse(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("pod", "must have the form 'namespace/pod'"), ("ns/p/c", "must have the form"), ("ns/-p", "pod name '-p'")],
)
def test_pod_ref_errors(text: str, fragment: str) -> None:
    with pytest.raises(RefError) as info:
        PodRef.parse(text)
    assert fragment in str(info.value)


def test_constructor_validates_too() -> None:
    with pytest.raises(RefError):
        ContainerRef("ns", "pod", "BAD")


@given(st.one_of(st.just("_"), label), label, label)
def test_round_trip(ns: str, pod: str, container: str) -> None:
    text = f"{ns}/{pod}/{container}"
    assert ContainerRef.parse(text).format() == text
    assert PodRef.parse(f"{ns}/{pod}").format() == f"{ns}/{pod}"


@given(st.text(max_size=80))
def test_arbitrary_text_raises_only_ref_errors(text: str) -> None:
    for parse in (ContainerRef.parse, PodRef.parse):
        with contextlib.suppress(RefError):
            parse(text)
