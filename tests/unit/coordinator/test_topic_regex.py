"""Subscription regexes as Kafka compiles and matches them (RE2/J: `Pattern.compile`, `matcher(topic).matches()`):
RE2's syntax, what RE2 refuses answered with INVALID_REGULAR_EXPRESSION in Kafka's words, the whole
name matched, in time linear in the name; odradek's bounds (length, counted repetitions, Unicode
classes, program memory) refused before any work; matching over many names in slices of bounded work."""

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odradek.coordinator import topic_regex
from odradek.coordinator.consumer_group import TopicsView
from odradek.coordinator.consumer_records import TopicMeta
from odradek.coordinator.topic_regex import (
    MAX_PROGRAM_SIZE, MAX_REGEX_BYTES, MAX_REPEAT_TOTAL, MAX_UNICODE_CLASSES, RegexError, compile_regex,
    match_in_slices, matching,
)
from odradek.protocol.error_codes import ErrorCode
from tests.unit.coordinator.harness import Harness
from tests.unit.coordinator.test_consumer_group import Member, group

TOPICS = TopicsView({"aaa": TopicMeta(uuid.UUID(int=1), 1), "orders": TopicMeta(uuid.UUID(int=2), 2)})


def matches(regex: str, name: str) -> bool:
    return compile_regex(regex).matches(name)


@pytest.mark.parametrize("regex, name, expected", [
    ("orders", "orders", True),
    ("orders", "orders-1", False),             # the whole name, not a prefix (matches(), not lookingAt())
    ("ord", "orders", False),
    ("rders", "orders", False),                # nor a substring (not find())
    ("orders-.*", "orders-1", True),
    ("^orders-.*$", "orders-1", True),          # explicit anchors change nothing
    ("a|ab", "ab", True),                      # leftmost-first alternation still finds the whole-name match
    ("(?i)ORDERS", "orders", True),
    ("[a-z]+\\.[0-9]{2}", "topic.42", True),
    ("\\d+", "123", True),
    ("\\w+", "my_topic-1", False),              # '-' is not a word character
    ("orders\\z", "orders", True),             # RE2's end of text
    ("(?P<t>ord)ers", "orders", True),         # named groups, as RE2/J accepts them
    ("t.pic", "t.pic", True),
    ("t\\.pic", "tapic", False),
])
def test_the_whole_name_is_matched_with_re2_semantics(regex, name, expected):
    assert matches(regex, name) is expected


@pytest.mark.parametrize("regex, cause", [
    ("[", "missing ]"),
    ("(orders", "missing )"),
    ("(a)\\1", "invalid escape sequence: \\1"),      # no backreferences
    ("(?=a)a", "invalid perl operator: (?="),        # no lookahead
    ("(?<!a)b", "invalid"),                          # no lookbehind
    ("a\\Z", "invalid escape sequence: \\Z"),        # Python's \\Z is RE2's \\z
    ("a**", "bad repetition operator"),
    ("(?:a{100}){100}", "invalid repetition size"),  # RE2 bounds nested repetition
])
def test_what_re2_refuses_is_an_invalid_regular_expression_in_kafkas_words(regex, cause):
    with pytest.raises(RegexError) as e:
        compile_regex(regex)
    assert str(e.value).startswith(f"SubscribedTopicRegex `{regex}` is not a valid regular expression: ")
    assert cause in str(e.value) and "b'" not in str(e.value)


def test_a_heartbeat_with_a_refused_regex_is_answered_invalid_regular_expression():
    h = Harness()
    for regex in ("(a)\\1", "(?=x)x", "x" * (MAX_REGEX_BYTES + 1)):
        r = Member(h, "m", topics=(), regex=regex).join(TOPICS)
        assert r.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION, regex
        assert r.error_message.startswith("SubscribedTopicRegex")
    assert not h.shard.consumer_groups
    ok = Member(h, "m", topics=(), regex="a+").join(TOPICS)
    assert ok.error_code == ErrorCode.NONE
    assert group(h).regexes["a+"].topics == ("aaa",)


def test_backtracking_patterns_take_linear_time():
    """`(a+)+` against a long run of `a`s ending in a mismatch: exponential for a backtracking engine (this
    would not finish), linear for RE2."""
    nested = compile_regex("(a+)+")
    assert not nested.matches("a" * 248 + "!") and nested.matches("a" * 249)
    assert not compile_regex("(a|aa)+$").matches("a" * 248 + "b")
    assert not compile_regex("(.*a){20}").matches("a" * 19 + "b" * 229)


def test_the_length_is_bounded_in_bytes_and_a_long_pattern_is_not_echoed():
    assert compile_regex("a" * MAX_REGEX_BYTES).matches("a" * MAX_REGEX_BYTES)
    for long in ("a" * (MAX_REGEX_BYTES + 1), "é" * (MAX_REGEX_BYTES // 2 + 1), "x" * (1 << 20)):
        with pytest.raises(RegexError) as e:
            compile_regex(long)
        assert str(e.value) == (f"SubscribedTopicRegex is too long ({len(long)} characters): at most "
                                f"{MAX_REGEX_BYTES} bytes of UTF-8 are accepted.")


def test_counted_repetitions_and_unicode_classes_are_bounded_before_compiling():
    """What makes RE2's compile cost grow faster than the pattern is refused up front."""
    assert compile_regex("[a-z0-9._-]{1,249}").matches("orders")
    assert compile_regex("a{500}b{500}").matches("a" * 500 + "b" * 500)
    for regex in ("a{1,249}" * 5, "a{999}b{2}", "(?:a{0,999}){0,2}", "a{1000000000000000000000}"):
        with pytest.raises(RegexError, match=f"more than the {MAX_REPEAT_TOTAL} accepted"):
            compile_regex(regex)
    assert compile_regex("\\p{Greek}" * MAX_UNICODE_CLASSES).matches("α" * MAX_UNICODE_CLASSES)
    with pytest.raises(RegexError, match="Unicode classes"):
        compile_regex("[\\pL\\PN]" * (MAX_UNICODE_CLASSES // 2 + 1))


def test_a_program_too_large_for_its_memory_is_refused():
    """RE2's `max_mem`: a program bigger than `MAX_PROGRAM_BYTES` is refused, not built."""
    with pytest.raises(RegexError, match="pattern too large - compile failed"):
        compile_regex("(?:(?:(?:[a-z]{0,10}){0,10}){0,9})" * 30)


def test_a_program_of_too_many_instructions_is_refused(monkeypatch):
    """Matching a name costs up to its length times the program's size: the size is bounded. RE2's own
    limit under `MAX_PROGRAM_BYTES` stops about there; the explicit bound is checked with a lower one."""
    assert compile_regex("[^x]{0,800}").program_size <= MAX_PROGRAM_SIZE   # a class is 9 UTF-8 instructions
    monkeypatch.setattr(topic_regex, "MAX_PROGRAM_SIZE", 1000)
    with pytest.raises(RegexError, match="compiles to 1804 instructions, more than the 1000 accepted"):
        compile_regex("[^x]{0,200}")


def test_re2s_cause_is_cut_short_where_it_quotes_the_whole_pattern():
    regex = "(" + "a" * 4000
    with pytest.raises(RegexError) as e:
        compile_regex(regex)
    assert str(e.value) == (f"SubscribedTopicRegex `{regex}` is not a valid regular expression: "
                            f"{('missing ): ' + regex)[:topic_regex.MAX_CAUSE_CHARS]}.")


def test_compiled_patterns_are_cached():
    assert compile_regex("cached-.*") is compile_regex("cached-.*")


def test_matching_in_slices_bounds_the_work_between_yields():
    pattern = compile_regex("t.*7")
    names = [f"t{i:05d}" for i in range(3000)]
    budget = 100 * pattern.cost(names[0])
    found: list[str] = []
    slices = 0
    seen_before = 0
    for _ in match_in_slices(pattern, names, found, budget):
        slices += 1
        assert len(found) - seen_before <= 10 + 1           # about a hundred names a slice: ten match
        seen_before = len(found)
    assert slices == 3000 // 100 - 1                         # no yield after the last slice
    assert found == [n for n in names if n.endswith("7")] == matching(pattern, names)


def test_a_heavier_pattern_gets_smaller_slices():
    light, heavy = compile_regex("t.*"), compile_regex("(?:(a|b)*a(a|b){30}){1,10}")
    assert heavy.program_size > 10 * light.program_size
    names = ["ab" * 20] * 100
    assert len(list(match_in_slices(heavy, names, []))) > len(list(match_in_slices(light, names, [])))


# Pieces of patterns for the property below: anchors, classes that include a newline, flags, alternation.
PIECES = ["a", "b", "ab", "-", "\\.", ".", ".*", ".+", "[^a]", "[^a]*", "\\s*", "\\S", "\\w+", "\\W", "\\n", "\\pL",
          "[\\x00-\\x{10FFFF}]", "(?s:.)", "(?s).*", "^", "$", "\\b", "\\B", "\\A", "\\z", "(?-m:^)", "(?-m:$)",
          "(?i)A", "(?U)a+", "(a|b)", "(?:ab|a)", "|", "a?", "(?P<n>b)", "[[:alpha:]]", "\\d", "x*"]
NAME_CHARS = "ab-.x1"


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=6),
       st.lists(st.text(NAME_CHARS, min_size=1, max_size=8), min_size=1, max_size=12, unique=True))
def test_matching_a_list_in_one_pass_finds_exactly_the_names_matched_one_by_one(pieces, names):
    regex = "".join(pieces)
    try:
        pattern = compile_regex(regex)
    except RegexError:
        return
    assert pattern.select(names) == [n for n in names if pattern.matches(n)]


def test_the_one_pass_form_is_used_unless_the_regex_anchors_to_the_text():
    assert compile_regex("orders-.*").lines_form() is not None
    for regex in ("\\Aorders", "orders\\z", "(?-m:^)orders", "(?i-m)orders", "a\\C"):
        assert compile_regex(regex).lines_form() is None, regex
        assert compile_regex(regex).select(["orders", "xorders"]) == [
            n for n in ["orders", "xorders"] if compile_regex(regex).matches(n)]
