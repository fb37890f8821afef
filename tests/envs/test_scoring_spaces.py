"""Format-invariant scoring helpers and the UnicodeText space (with the observation escaper)."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentrl_envs.tasks.scoring import contains_figure, contains_name, extract_numbers, normalize_text
from agentrl_envs.text.observation import printable
from agentrl_envs.text.spaces import UnicodeText, charset

# -- normalize_text --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<b>Total</b>: 42", "Total : 42"),
        ("<p>Hello</p><br/><span class='x'>world</span>", "Hello world"),
        ("**bold** __under__ `code` ~~strike~~", "bold under code strike"),
        ("# Heading\n\n> quoted | cell |", "Heading quoted cell"),
        ("Done 🎉✅ 👍🏽", ""),  # "done"-style claims are stripped too
        ("Revenue 🎉✅ 👍🏽", "Revenue"),
        ("Alice 👩\u200d💻 Smith", "Alice Smith"),
        ("x\ufe0f y\u200b z", "x y z"),
        ("  many \n\t spaces  ", "many spaces"),
        ("", ""),
        ("Chloé Martin, 1,234.5", "Chloé Martin, 1,234.5"),
    ],
)
def test_normalize_text(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


def test_normalize_text_keeps_numbers_and_words_of_decorated_answers() -> None:
    plain = "The total is 1,120.50 for Alice Smith"
    decorated = "**The total** is <b>1,120.50</b> 🎉 for _Alice Smith_ ✅"
    assert normalize_text(decorated) == normalize_text(plain)
    assert extract_numbers(decorated) == extract_numbers(plain) == [1120.5]


# -- numbers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, numbers",
    [
        ("12,345.6 and 7", [12345.6, 7.0]),
        ("1,000,000", [1000000.0]),
        ("-3.5 +2", [-3.5, 2.0]),
        ("v2 x4 a1b", []),
        ("no numbers here", []),
        ("**1,234**", [1234.0]),
    ],
)
def test_extract_numbers(text: str, numbers: list[float]) -> None:
    assert extract_numbers(text) == numbers


@pytest.mark.parametrize(
    "text",
    [
        "Revenue was 12,345.67 USD",
        "Revenue was 12345.67",
        "Revenue: **12,345.67** 💰",
        "<b>12345.670</b>",
        "12345.68",  # within the 0.011 tolerance
    ],
)
def test_contains_figure_accepts_formats_and_tolerance(text: str) -> None:
    assert contains_figure(text, [12345.67], max_numbers=3)


@pytest.mark.parametrize("text", ["Revenue was 12,345.70", "Revenue was 12,346", "Revenue was 1,234.567", "nothing"])
def test_contains_figure_rejects_wrong_values(text: str) -> None:
    assert not contains_figure(text, [12345.67], max_numbers=3)


def test_contains_figure_relative_tolerance_for_large_values() -> None:
    assert contains_figure("about 5,000,000.5", [5_000_000.0], max_numbers=1)
    assert not contains_figure("about 5,000,100", [5_000_000.0], max_numbers=1)


def test_contains_figure_needs_every_figure() -> None:
    assert contains_figure("north 120.5, south 99.99", [120.5, 99.99], max_numbers=2)
    assert not contains_figure("north 120.5", [120.5, 99.99], max_numbers=2)
    assert contains_figure("no numbers", [], max_numbers=0)


def test_contains_figure_max_numbers_cap_defeats_number_stuffing() -> None:
    stuffed = " ".join(str(i) for i in range(1000))
    assert not contains_figure(stuffed, [42], max_numbers=5)
    assert not contains_figure("42 1 2 3 4 5", [42], max_numbers=5)
    assert contains_figure("42 1 2 3 4", [42], max_numbers=5)
    # Separators do not let one number count as many, nor many as one.
    assert contains_figure("1,234,567", [1234567], max_numbers=1)
    assert not contains_figure("1, 234, 567", [1234567], max_numbers=1)


# -- names -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Alice Smith",
        "alice smith",
        "The top customer is **Alice Smith**.",
        "<b>Alice</b> 🎉 Smith",
        "ALICE-SMITH",
    ],
)
def test_contains_name_matches(text: str) -> None:
    assert contains_name(text, "Alice Smith")


@pytest.mark.parametrize(
    "text",
    [
        "Alice Smithson",
        "Alice",
        "Smith Alice",
        "Bob Alice Smith Carol Dave Eve Frank Grace Heidi",  # padded with candidates
        "",
    ],
)
def test_contains_name_rejects(text: str) -> None:
    assert not contains_name(text, "Alice Smith")


def test_contains_name_extra_words_limit() -> None:
    text = "The best customer was Alice Smith this quarter"  # 6 extra words
    assert contains_name(text, "Alice Smith")
    assert not contains_name(text, "Alice Smith", max_extra_words=5)
    assert not contains_name("anything", "")
    assert contains_name("Chloé Martin", "CHLOÉ MARTIN")


# -- UnicodeText -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain ascii",
        "line one\nline two\ttabbed",
        "emoji 👋🎉 and pictographs 🀄",
        "accents é ü ñ, Greek τ, CJK 売上, Arabic مرحبا",
        "x" * 100,
    ],
)
def test_unicode_text_contains_printable_text(text: str) -> None:
    assert UnicodeText(100).contains(text)
    assert text in UnicodeText(100)


@pytest.mark.parametrize(
    "value",
    [
        "a\x00",
        "a\x1b[31m",
        "carriage\r",
        "bell\x07",
        "del\x7f",
        "\x85",
        "\u2028",
        "\ud800",
        "x" * 101,
        b"bytes",
        None,
        5,
        ["a"],
    ],
)
def test_unicode_text_rejects(value: object) -> None:
    assert not UnicodeText(100).contains(value)


def test_unicode_text_min_length() -> None:
    space = UnicodeText(10, min_length=3)
    assert not space.contains("ab")
    assert space.contains("abc")


def test_unicode_text_pickles_equal() -> None:
    space = UnicodeText(321, min_length=2, seed=7)
    clone = pickle.loads(pickle.dumps(space))
    assert clone == space
    assert isinstance(clone, UnicodeText)
    assert (clone.min_length, clone.max_length) == (2, 321)
    assert clone.contains("héllo 👋\n") and not clone.contains("a\x00")
    assert clone.character_set == space.character_set
    assert copy.deepcopy(space) == space
    # Pickles stay small: the process-wide tables are not serialized.
    assert len(pickle.dumps(space)) < 10_000


def test_unicode_text_samples_are_contained() -> None:
    space = UnicodeText(50, seed=0)
    for _ in range(20):
        assert space.contains(space.sample())


def test_charset_is_sorted_and_printable() -> None:
    chars = charset()
    assert chars == "".join(sorted(chars))
    assert "\n" in chars and "\t" in chars and "👋" in chars
    assert "\r" not in chars and "\x00" not in chars
    assert all(c.isprintable() for c in chars if c not in "\n\t")


# -- printable() output is always an admissible observation ----------------------------------------

_ANY_CHAR = st.one_of(
    st.characters(codec=None, exclude_categories=()),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=()),
    st.characters(min_codepoint=0, max_codepoint=0x9F, exclude_categories=()),
)
_BIG = UnicodeText(100_000)
_EMOJI_LO, _EMOJI_HI = 0x1F000, 0x1FAFF


def _in_supported_planes(text: str) -> bool:
    return all(ord(c) <= 0xFFFF or _EMOJI_LO <= ord(c) <= _EMOJI_HI for c in text)


@settings(max_examples=300, deadline=None)
@given(st.text(_ANY_CHAR, max_size=200).filter(_in_supported_planes))
@example("\x00\r\x1b\x7f\x85\u2028\ud800\udfff\ufeff")
@example("emoji 👋 and\nnew\tline")
def test_printable_output_is_unicode_text_in_the_bmp_and_emoji_ranges(text: str) -> None:
    assert _BIG.contains(printable(text))


@settings(max_examples=300, deadline=None)
@given(st.text(_ANY_CHAR, max_size=200))
@example("\U00020000")
def test_printable_output_is_always_unicode_text(text: str) -> None:
    assert _BIG.contains(printable(text))
