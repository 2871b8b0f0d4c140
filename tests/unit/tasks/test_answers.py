"""Answer extraction and equivalence: golden cases, registry, fuzzing for crashes and slowness."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import UserError
from harness.tasks import answers
from harness.tasks.answers import EXTRACTORS, canonical, equivalent, final_segment
from harness.tasks.scoring import explain, score
from harness.tasks.suite import Scoring, load_task

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "answers"
EXTRACTION = yaml.safe_load((FIXTURES / "extraction.yaml").read_text(encoding="utf-8"))
EQUIVALENCE = yaml.safe_load((FIXTURES / "equivalence.yaml").read_text(encoding="utf-8"))
GOLDEN = yaml.safe_load((FIXTURES / "golden.yaml").read_text(encoding="utf-8"))
VERDICTS = yaml.safe_load((FIXTURES / "verdicts.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", EXTRACTION, ids=lambda c: f"{c['extractor']}:{c['note']}")
def test_golden_extraction(case):
    ex = EXTRACTORS[case["extractor"]]
    choices = case.get("choices")
    assert ex.strict(case["text"], choices) == case["strict"]
    assert ex.flexible(case["text"], choices) == case["flexible"]


@pytest.mark.parametrize("case", GOLDEN, ids=lambda c: f"{c['extractor']}:{c['style']}")
def test_golden_styles(case):
    """Completions in today's model styles: the verdict a careful reader gives, with a reason
    whenever there is no answer."""
    strict, flexible = EXTRACTORS[case["extractor"]].read(case["text"], case.get("choices"))
    assert (strict.value, flexible.value) == (case["strict"], case["flexible"])
    for reading in (strict, flexible):
        assert (reading.value is None) == (reading.reason is not None)
        assert reading.value is None or reading.rule


def test_golden_styles_cover_every_answer_type_and_style():
    styles = {(c["extractor"], c["style"]) for c in GOLDEN}
    for extractor in ("number", "choice", "yes_no", "true_false", "string", "math"):
        assert len({s for e, s in styles if e == extractor}) >= 3, extractor
    assert {s for _, s in styles} >= {
        "gsm8k_hashes", "answer_is", "boxed", "minerva", "think", "markdown_bold", "answer_colon",
        "chat_preamble", "zero_shot_cot", "several", "hedge", "non_answer", "next_line",
        "not_a_letter", "number_words", "spaced_letters", "punctuation", "json",
    }  # fmt: skip


@pytest.mark.parametrize(
    "case", VERDICTS, ids=lambda c: f"{c['class']}:{c['family']}:{c.get('note', c['gold'])}"
)
def test_golden_verdicts(case):
    """A whole completion scored under a shipped task: reasoning delimiters, equivalence, the
    answer's reading, with the task's scoring rules (or the case's own)."""
    spec = load_task(case["task"])
    if "scoring" in case:
        spec = spec.model_copy(update={"scoring": Scoring(**case["scoring"])})
    gold = canonical(spec.answer_type, case["gold"])
    assert gold is not None
    result = score(spec, case["completion"], gold)
    why = explain({"id": "-", "gold": gold, **result})
    assert result["correct"] is case["correct"], why
    for key in ("flexible_correct", "flexible_rule"):
        assert result[key] == case.get(key, result[key]), (key, why)


def test_golden_verdicts_cover_each_class_in_four_families():
    families: dict[str, set[str]] = {}
    for case in VERDICTS:
        families.setdefault(case["class"], set()).add(case["family"].split("-")[0])
    classes = ("delimiters", "equal_forms", "not_equal", "number_words", "percent", "next_line",
               "closing_sentence", "restated_answer")  # fmt: skip
    for cls in classes:
        assert len(families[cls]) >= 4, (cls, families[cls])


def test_golden_closing_sentences_are_flexible_only_in_four_families():
    """A closing sentence is never a strict answer: under a strict headline each case is wrong,
    and in four families or more the flexible reading takes it (and is right), in four or more a
    safeguard leaves it to another rule."""
    cases = [c for c in VERDICTS if c["class"] == "closing_sentence"]
    read, declined = set(), set()
    for case in cases:
        family = case["family"].split("-")[0]
        assert "flexible_rule" in case, case
        if load_task(case["task"]).headline == "strict":
            assert case["correct"] is False, case
        if case["flexible_rule"] == "closing_sentence":
            assert case["flexible_correct"] is True, case
            read.add(family)
        else:
            declined.add(family)
    assert len(read) >= 4 and len(declined) >= 4, (read, declined)


def test_math_equivalence_follows_the_task_rules():
    assert equivalent("math", "18, 14, 7", "7,14,18")
    assert not equivalent("math", "18, 14, 7", "7,14,18", ordered=True)
    assert equivalent("math", "(3,-1)", "(3, -1)", ordered=True)
    assert not equivalent("math", "5 \\text{ cm}", "5")
    assert equivalent("math", "5 \\text{ cm}", "5", strip_units=True)
    assert equivalent("math", "\\frac{37}{4}m", "\\frac{37m}{4}", strip_units=True)
    assert not equivalent("math", "\\text{Evelyn}", "5", strip_units=True)


def test_several_answers_are_no_answer_with_a_reason():
    strict, flexible = EXTRACTORS["choice"].read("So the answer is (A) or (B).")
    assert strict.value is flexible.value is None
    assert strict.reason == flexible.reason == "several answers named: (A), (B)"
    assert strict.rule == "answer_phrase" and strict.span == "(A) or (B)."


def test_spaced_letters_equal_the_word():
    assert equivalent("string", "n y t n", "nytn")
    assert not equivalent("string", "n, y, t, n", "nytn")  # as Zero-shot-CoT's scorer reads it
    assert not equivalent("string", "apple banana", "applebanana")


@pytest.mark.parametrize("case", EQUIVALENCE, ids=lambda c: f"{c['type']}:{c['pred']}~{c['gold']}")
def test_golden_equivalence(case):
    assert equivalent(case["type"], case["pred"], case["gold"]) is case["equal"]


def test_golden_files_cover_every_extractor_and_type():
    assert {c["extractor"] for c in EXTRACTION} == set(EXTRACTORS)
    assert {c["type"] for c in EQUIVALENCE} == set(answers.ANSWER_TYPES) - {"valid_invalid"}


def test_registry_is_explicit_and_versioned():
    for name, ex in EXTRACTORS.items():
        assert ex.name == name
        assert isinstance(ex.version, int) and ex.version >= 1
        assert set(ex.answer_types) <= set(answers.ANSWER_TYPES)
    with pytest.raises(UserError, match="valid: .*number"):
        answers.get_extractor("numbers")
    with pytest.raises(UserError, match="unknown answer type"):
        equivalent("float", "1", "1")


@pytest.mark.parametrize(
    ("answer_type", "raw", "expected"),
    [
        ("number", "1,080", "1080"),
        ("number", "39.0", "39"),
        ("number", 39.0, "39"),
        ("number", "0.3333333333333333", "1/3"),
        ("number", "0.26", "0.26"),
        ("number", "9 (apples)", None),
        ("number", "", None),
        ("choice", "(B)", "B"),
        ("choice", "b", "B"),
        ("choice", "(B) and (C)", None),
        ("yes_no", True, "yes"),
        ("yes_no", "No", "no"),
        ("yes_no", "maybe", None),
        ("true_false", "False", "false"),
        ("valid_invalid", "invalid", "invalid"),
        ("string", ' "Yajo". ', "yajo"),
        ("date", "5/1/2021", "05/01/2021"),
        ("date", "13/01/2021", None),
        ("math", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("math", "  ", None),
    ],
)
def test_canonical_gold_forms(answer_type, raw, expected):
    assert canonical(answer_type, raw) == expected


def test_final_segment_is_after_the_last_think():
    assert final_segment("a</think>b</think> The answer is 3.") == " The answer is 3."
    assert final_segment("no thinking") == "no thinking"


def test_final_segment_reads_the_solution_part():
    text = (
        "<|begin_of_thought|>4?<|end_of_thought|><|begin_of_solution|>It is 5.<|end_of_solution|>"
    )
    assert final_segment(text) == "It is 5."
    assert final_segment("<think>3</think>x<answer>7</answer>") == "7"
    assert final_segment("a ◁/think▷ b") == " b"
    assert final_segment("a [DONE] b", ("[DONE]",)) == " b"
    assert final_segment("<think>never closed, 3") == "<think>never closed, 3"


def test_extractors_return_none_on_non_text():
    for ex in EXTRACTORS.values():
        assert ex.strict(None) is None and ex.flexible(None) is None  # type: ignore[arg-type]


def test_math_verdicts_consult_no_clock(monkeypatch):
    """A verdict must not depend on how busy the machine is: Math-Verify runs without its
    SIGALRM timeouts (which fired on loaded machines and scored a pair False, then True), and the
    work is bounded by the answers instead. No alarm is ever armed while pairs are compared."""
    import signal

    armed: list[int] = []
    real = signal.alarm
    monkeypatch.setattr(signal, "alarm", lambda s: armed.append(s) or real(s))
    answers._mv_parse.cache_clear()
    answers._mv_verify.cache_clear()
    pairs = [("(x+1)^2", "x^2+2x+1"), ("\\sqrt{8}", "2\\sqrt{2}"), ("\\frac{\\pi}{4}", "0.785")]
    assert [equivalent("math", p, g) for p, g in pairs] == [True, True, False]
    assert [s for s in armed if s] == []


@pytest.mark.parametrize(
    "pred",
    ["2^{2^{2^{2^{10}}}}", "10^{10^{9}}", "9^{99999}", "100000!", "2^2^2^2^2"],
)
def test_answers_whose_value_cannot_be_built_are_no_match_without_a_clock(pred):
    """A power tower or a huge power or factorial would keep sympy busy for hours: refused from
    the text before parsing (the bound on the work), so the verdict is the same on any machine."""
    assert equivalent("math", pred, "5") is False
    assert equivalent("math", pred, pred) is True  # the same text is equal before any parsing


def test_math_verify_works_outside_the_main_thread():
    """Math-Verify runs without signal.alarm, so off the main thread it gives the same verdicts."""
    results: list[object] = []

    def check():
        try:
            results.append(equivalent("math", "(x+1)^2", "x^2+2x+1"))
            results.append(equivalent("math", "\\sqrt{8}", "3"))
        except Exception as e:  # the test fails on any exception in the thread
            results.append(e)

    t = threading.Thread(target=check)
    t.start()
    t.join(60)
    assert results == [True, False]


# --- fuzzing: never raise, stay fast ---------------------------------------------------------------

_TOKENS = [
    "The answer is ", "answer:", "####", "\\boxed{", "\\fbox{", "{", "}", "\\", "\\frac{", "$", "(", ")",
    "(A)", "B)", "[", "]", "-", "−", ".", ",", "/", "1", "0", "9999", "1,000", "3/4", "yes", "no",
    "True", "invalid", "\"", "“", "\n", " ", "*", "</think>", "12/31/2020", "ß", "٣", "\x00",
]  # fmt: skip
_fragments = st.lists(st.sampled_from(_TOKENS) | st.text(max_size=5), max_size=200).map("".join)
_CHOICES = ["orange ball", "white ball", "blue ball", "4.5%", "$200.00"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_fragments, with_choices=st.booleans())
def test_extractors_never_raise(text, with_choices):
    choices = _CHOICES if with_choices else None
    for ex in EXTRACTORS.values():
        for value in (ex.strict(text, choices), ex.flexible(text, choices)):
            assert value is None or isinstance(value, str)
            if value is not None and ex.name != "math":
                # a non-math extractor's answer is one its own type accepts as canonical
                assert equivalent(ex.answer_types[0], value, value)


@settings(max_examples=200, deadline=None)
@given(pred=_fragments, gold=st.sampled_from(["18", "1/6", "B", "yes", "] ) }", "05/01/2021"]))
def test_equivalence_never_raises(pred, gold):
    for answer_type in ("number", "choice", "yes_no", "string", "date"):
        assert equivalent(answer_type, pred, gold) in (True, False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=400), with_choices=st.booleans())
def test_extraction_is_total_and_deterministic_on_any_unicode(text, with_choices):
    choices = _CHOICES if with_choices else None
    for ex in EXTRACTORS.values():
        first = ex.read(text, choices)
        assert ex.read(text, choices) == first  # deterministic
        for reading in first:
            assert reading.value is None or isinstance(reading.value, str)
            assert (reading.value is None) == (reading.reason is not None)


@pytest.mark.slow  # megabytes of text: make test, not make check
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unit=_fragments.filter(bool))
def test_extraction_reads_one_megabyte(unit):
    """A 1 MB completion (a repeated fragment, as a degenerate generation is) reads, the same way
    twice, with every extractor (timings: benchmarks/extraction.py)."""
    text = (unit * (1_000_000 // len(unit) + 1))[:1_000_000]
    for ex in EXTRACTORS.values():
        choices = _CHOICES if ex.name == "choice" else None
        first = ex.read(text, choices)
        assert ex.read(text, choices) == first


def _adversarial() -> dict[str, str]:
    n = 10_000
    alphabet = "0123456789{}()[]\\$/.,-: Aanswer is\n"
    mixed = "".join(alphabet[(i * 7919) % len(alphabet)] for i in range(n))
    return {
        "digits": "7" * n,
        "comma_digits": "1," * (n // 2),
        "open_braces": "{" * n,
        "open_boxes": "\\boxed{" * (n // 7),
        "nested_box": "\\boxed{" + "{" * (n - 1000) + "}" * 900,
        "backslashes": "\\" * n,
        "letters": "(A) B) " * (n // 7),
        "mixed": mixed,
        "statements": "The answer is " * (n // 14),
        "fracs": "\\frac{1}{2}" * (n // 11),
        "dates": "12/31/2020 " * (n // 11),
        "closed_boxes": "\\boxed{1}" * (n // 9),
        "answer_then_digits": "answer: " + "9" * n,
    }


def test_extractors_read_adversarial_text():
    """Every extractor reads 10,000 characters of digits, braces and backslashes, the same way
    twice, and returns an answer or None (catastrophic backtracking would hang here; the
    milliseconds each call takes are in benchmarks/extraction.py)."""
    for text in _adversarial().values():
        for ex in EXTRACTORS.values():
            for fn in (ex.strict, ex.flexible):
                choices = _CHOICES if ex.name == "choice" else None
                got = fn(text, choices)
                assert got == fn(text, choices), ex.name


def test_math_equivalence_bounds_long_input():
    assert equivalent("math", "x+" * 400 + "1", "y") is False


def test_explain_never_prints_an_empty_span():
    """A reading whose rule recorded no span is shown with its rule alone, not `[rule: ]`."""
    result = {"id": "a", "gold": "3", "correct": True, "strict": None, "strict_rule": None,
              "strict_reason": "no answer statement", "flexible": "3",
              "flexible_rule": "last_number", "flexible_span": ""}  # fmt: skip
    line = explain(result)
    assert "flexible='3' [last_number]" in line and ": ]" not in line
    assert "strict=None (no answer statement)" in line
    line = explain({**result, "flexible_span": "3 apples"})
    assert "flexible='3' [last_number: 3 apples]" in line
