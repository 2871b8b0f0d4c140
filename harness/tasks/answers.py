"""Answer extraction and equivalence: pure, named, versioned.

    >>> from harness.tasks.answers import EXTRACTORS, equivalent
    >>> EXTRACTORS["number"].strict("She pays $1,080 in all. The answer is $1,080.")
    '1080'
    >>> equivalent("number", "0.17", "1/6")
    True

Each extractor reads a completion twice (`Extractor`): `strict` from the last explicit answer
statement only ("The answer is X", "Answer: X", "#### X", \\boxed{X}), `flexible` from earlier ones
too, and with no statement at all the closing sentence ("So there are 5 rats in each cage."),
else the last candidate of the type anywhere. A failed parse is None, never a guess. Extractors never raise and run in linear time on any input. Bump an
extractor's `version` whenever its output can change: traces and eval cells scored by an earlier
version are re-scored from their completions where they are read (never regenerated).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from harness.errors import UserError

ANSWER_TYPES = (
    "number", "math", "choice", "yes_no", "true_false", "valid_invalid", "string", "date",
)  # fmt: skip

Choices = Sequence[str] | None

_SPAN_CHARS = 500  # how much text after "The answer is" a value may come from
_MAX_MARKERS = 16  # explicit answer statements tried, newest first
_MAX_BOXED = 2000  # longest \boxed{...} content read
_MAX_CANDIDATES = 16  # flexible candidates tried, newest first

# --- explicit answer statements (strict) ---------------------------------------------------------

# "The (final|correct) answer (to the question) (arabic numerals) is/was/would be/:", JSON
# "answer": ..., "**Answer**:", "####". `conn` is empty for a bare "Answer B" (AQuA's rationales),
# which only the choice extractor accepts.
_MODAL = r"(?:would|will|should|must|might|could|may|has\s+to|have\s+to|seems\s+to|appears\s+to)"
_ADVERB = (
    r"(?:most\s+|very\s+|quite\s+)?(?:likely|probably|definitely|certainly|still|then|also|clearly)"
)
_PHRASE = re.compile(
    r"(?i:\b(?:answers?|ans)\b(?!\s*(?:choices?|options?)\b)"
    r"(?:\s+(?:to|for)\s+(?:the|this|that|your|our)\s+(?:question|problem|riddle|puzzle|task))?"
    r"(?:\s*\([^()\n]{0,60}\))?"  # Zero-shot-CoT's "answer (arabic numerals) is"
    r"[\"'*_]*"  # "**Answer**:", JSON "answer":
    rf"(?P<conn>\s+(?:is|are|was|were|(?:{_MODAL}(?:\s+{_ADVERB})?\s+be))\b(?:\s*[:,])?"
    r"(?!\s*(?:correct|right|wrong|incorrect|reasonable|consistent|confirmed|verified|valid\s+because|"
    r"different|unchanged|accurate|plausible|sensible|logical|satisfactory|based|derived|"
    r"obtained|calculated|determined|explained|justified|supported|shown)\b"
    r"|\s*not\s+(?:\([A-R]\)|[A-R]\b|option\b|choice\b))"
    r"|\s*[:=]|\s+[-–](?=\s))?"
    r"|\b(?:correct|right|best)\s+(?:option|choice)\b(?P<conn2>\s+is\b|\s*:)?)"
    r"|####(?!\s*[A-Za-z]{2})"  # GSM8K's "#### 18", not a markdown heading "#### Case 1"
)
_BARE_LETTER = re.compile(r"[ \t]*[:\-–]?[ \t]*[(\[]?[A-Ra-r](?![\w'’-])")
# "(B) is the correct answer", "E is the answer": a choice stated after the letter.
_LETTER_FIRST = re.compile(
    r"(?:\((?P<p>[A-R])\)|\b(?P<l>[A-R]))\s+is\s+(?:the\s+)?"
    r"(?:(?:correct|right|best)\s+(?:answer|option|choice)|correct|answer)\b"
)
# A last line that is only a letter ("\nD", "(B)", "Option B.") states a choice, as AQuA's rationales do.
_LAST_LINE_LETTER = re.compile(
    r"(?:^|\n)[ \t*(\[]*(?:(?i:option|choice)\s*[:.\-–]?\s*)?\(?([A-R])[)\]]?[ \t.*]*$"
)
# A last line "A: 3": the answer line of GSM8K-style fine-tuned models (Cobbe et al.).
_A_LINE = re.compile(r"(?:^|\n)[ \t]*A:[ \t]*([^\n]{1,80}?)[ \t]*$")
# A new "Q:" turn after the answer: the model went on to invent the next exemplar.
_NEXT_TURN = re.compile(r"\n[ \t]*(?:Q|Question)[ \t]*:")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_DECOR = " \t*_`'\"“”‘’>#"  # markdown, quotes and fences around a value on its own line

# The ends of a reasoning part in the formats today's models write (R1 distills, QwQ, Sky-T1 /
# OpenThoughts, Kimi, Gemma/Llama reasoning fine-tunes); a task adds its own (`scoring:
# reasoning_ends`). Only the text after the last one is scored.
REASONING_ENDS = (
    "</think>", "</thinking>", "</thought>", "</reasoning>", "<|end_of_thought|>", "◁/think▷",
    "<|end_of_reasoning|>", "<|/think|>",
)  # fmt: skip
# A solution part that holds the answer: when one opens in the scored text, only its content
# (to its close, or to the end) is read.
SOLUTION_BLOCKS = (
    ("<|begin_of_solution|>", "<|end_of_solution|>"), ("<solution>", "</solution>"),
    ("<answer>", "</answer>"), ("<|begin_of_answer|>", "<|end_of_answer|>"),
)  # fmt: skip


def final_segment(text: str, reasoning_ends: Sequence[str] = ()) -> str:
    """The part of a completion that is scored: after the last end of a reasoning part
    (REASONING_ENDS and `reasoning_ends`), and within its last solution block if it has one.
    A reasoning part that never ends leaves the whole text to be read."""
    return final_segments(text, reasoning_ends)[0]


def final_segments(text: str, reasoning_ends: Sequence[str] = ()) -> list[str]:
    """The scored part (`final_segment`) and, when it is a solution block cut off before its
    close, the text before that block: the reasoning the solution followed, which is read only
    where the cut-off block states no answer (its opening ended the reasoning)."""
    cut = max(
        ((i + len(end)) for end in (*REASONING_ENDS, *reasoning_ends) if end
         for i in [text.rfind(end)] if i >= 0),
        default=0,
    )  # fmt: skip
    whole, text = text, text[cut:]
    for begin, end in SOLUTION_BLOCKS:
        start = text.rfind(begin)
        if start >= 0:
            body = text[start + len(begin) :]
            stop = body.find(end)
            if stop >= 0:
                body = body[:stop]
            if body.strip():
                before = whole[: cut + start]
                return [body] if stop >= 0 or not before.strip() else [body, before]
    return [text]


def _before_next_turn(text: str) -> str:
    """Up to a new "Q:" turn the model invented after its answer (few-shot run-on)."""
    m = _NEXT_TURN.search(text)
    return text[: m.start()] if m and text[: m.start()].strip() else text


def _braced(text: str, start: int) -> str | None:
    """Content of a brace group whose `{` ends just before `start`, or None if unclosed (bounded)."""
    depth = 1
    stop = min(len(text), start + _MAX_BOXED)
    for m in re.finditer(r"[{}]", text[start:stop]):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return text[start : start + m.start()]
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last closed \\boxed{...} or \\fbox{...} (brace-matched), or None."""
    return _newest(_BOXED.finditer(text), lambda m: _braced(text, m.end()), _MAX_MARKERS)


def _value_line(span: str) -> str:
    """The first line of a statement's span; the next non-empty one when the statement ends its
    line ("The answer is:\\n\\n**42**", '>> FINAL ANSWER:\\n\\"\\"\\"\\n5')."""
    return next((line for line in span.split("\n", 4)[:4] if line.strip(_DECOR + ":")), "")


_JSON_STRING = re.compile(r'\s*("(?:[^"\\\n]|\\.){0,1000}")')


def _json_value(span: str) -> str:
    """The value of a JSON "answer": "..." (its escapes decoded), else the span's first line."""
    m = _JSON_STRING.match(span)
    if m:
        try:
            return json.loads(m.group(1))
        except json.JSONDecodeError:
            pass
    return _value_line(span)


@dataclass(frozen=True)
class Statement:
    pos: int
    rule: str  # boxed | answer_phrase | hashes | option_phrase | letter_first | last_line_letter | a_line
    span: str  # the text the value is read from


# what may stand between two boxes that give one answer together, on one line
_BOX_JOIN = re.compile(
    r"[ \t$]*(?:,|;|&|\band\b|\bor\b|\\text\s*\{\s*(?:,|and|or)\s*\}|\\q?quad)?[ \t$]*"
    r"(?:[a-zA-Z](?:_[0-9a-z]|_\{[0-9a-z]{1,3}\})?\s*=\s*)?[ \t$]*"
)


def _statements(
    text: str, bare_ok: bool, join_boxes: bool = False, drop_loops: bool = False
) -> list[Statement]:
    """Explicit answer statements in text order (at most the last _MAX_MARKERS). `join_boxes`:
    boxes that follow each other on one line ("\\boxed{3} and \\boxed{5}") are one statement of
    a list."""
    found: deque[Statement] = deque(maxlen=_MAX_MARKERS)
    for m in _PHRASE.finditer(text):
        if m.group() == "####":
            rule = "hashes"
        elif m.group("conn") or m.group("conn2"):
            rule = "answer_phrase" if m.group("conn") else "option_phrase"
            if '"' in m.group() and ":" in (m.group("conn") or ""):
                rule = "json_answer"
        elif (
            bare_ok
            and not m.group().lower().startswith(("correct", "right", "best"))
            and _BARE_LETTER.match(text, m.end())
        ):
            rule = "answer_phrase"
        else:
            continue
        span = text[m.end() : m.end() + _SPAN_CHARS]
        value = _json_value(span) if rule == "json_answer" else _value_line(span)
        if value.strip(" \t\n*_`:"):  # "Final Answer:" with nothing after it states nothing
            found.append(Statement(m.start(), rule, value))
    more: list[Statement] = []
    end = -1  # where the previous box closed
    boxes = [(m, _braced(text, m.end())) for m in deque(_BOXED.finditer(text), maxlen=_MAX_MARKERS)]
    read = [(m, c) for m, c in boxes if c is not None]
    for m, content in _without_loops(read, text) if drop_loops else read:
        if join_boxes and more and end >= 0 and _BOX_JOIN.fullmatch(text, end, m.start()):
            first = more.pop()  # "x = \boxed{3} or x = \boxed{5}": one answer, the list 3, 5
            more.append(Statement(first.pos, "boxed", f"{first.span}, {content}"))
        else:
            more.append(Statement(m.start(), "boxed", content))
        end = m.end() + len(content) + 1
    tail = text.rstrip()[-_SPAN_CHARS:]
    if a_line := _A_LINE.search(tail):
        more.append(Statement(len(text) - 1, "a_line", a_line.group(1)))
    if bare_ok:
        for m in deque(_LETTER_FIRST.finditer(text), maxlen=_MAX_MARKERS):
            more.append(Statement(m.start(), "letter_first", m.group("p") or m.group("l")))
        if last := _LAST_LINE_LETTER.search(tail):
            more.append(Statement(len(text), "last_line_letter", last.group(1)))
    return sorted([*found, *more], key=lambda st: st.pos)[-_MAX_MARKERS:]


_LOOP = 4  # the same box this many times in a row, nothing but space between: a loop


def _without_loops(boxes: list[tuple[re.Match, str]], text: str) -> list[tuple[re.Match, str]]:
    """The boxes (match, content) without degenerate runs: a model caught in a loop writes the
    same box again and again ("\\boxed{1}\\boxed{1}..." hundreds of times), which states no answer;
    the statement before the loop stays the last one."""
    out: list[tuple[re.Match, str]] = []
    run: list[tuple[re.Match, str]] = []
    for m, content in [*boxes, (None, "")]:  # the last entry closes the last run
        prev = run[-1] if run else None
        if (
            prev is not None
            and m is not None
            and content == prev[1]
            and not text[prev[0].end() + len(prev[1]) + 1 : m.start()].strip()
        ):
            run.append((m, content))
            continue
        out += run if len(run) < _LOOP else []
        run = [(m, content)] if m is not None else []
    return out


# Hedges before a value that still commit to it: "probably 12", "most likely (B)", "likely to be yes".
_HEDGE = re.compile(
    r"(?i)(?:[\s*_`'\"“”‘’:,]|\b(?:(?:most|very|highly|quite)\s+)?(?:probably|likely|possibly|"
    r"presumably|technically|definitely|certainly|clearly|obviously|actually|indeed|simply|"
    r"still|then|therefore|thus|hence|now|also|that|going\s+to\s+be|to\s+be|be|"
    r"I\s+(?:believe|think|guess|would\s+say))\b)*"
)


def _unhedged(span: str) -> str:
    return span[_matched(_HEDGE, span).end() :]


def _matched(pattern: re.Pattern[str], text: str, pos: int = 0) -> re.Match[str]:
    """`pattern.match` for a pattern that matches every text (all of it optional)."""
    m = pattern.match(text, pos)
    assert m is not None, pattern.pattern
    return m


def _first_sentence(span: str) -> str:
    """Up to the first line break or sentence-ending period (not a decimal point, nor the
    period of a title such as Mrs.)."""
    return re.split(rf"\n|{_NOT_A_TITLE}\.(?=\s|$)|[!?;](?=\s|$)", span, maxsplit=1)[0]


_NOT_A_TITLE = r"(?<!\bMr)(?<!\bMrs)(?<!\bMs)(?<!\bDr)(?<!\bSt)(?<!\bProf)"


# --- numbers ---------------------------------------------------------------------------------------

_NUM = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+"
_CURRENCY = r"(?:[$£€¥₹]\s?|(?:USD|Rs\.?|INR)\s?)?"
_SIGNED = rf"(?P<sign>[-−]?){_CURRENCY}(?P<num>{_NUM})(?:\s?/\s?(?P<den>{_NUM}))?"  # -$1,080, 3/4
_NUMBER = re.compile(rf"(?<![\w.,/]){_SIGNED}(?![0-9/])")
_NUMBER_AT = re.compile(
    r"[\s*_`'\"“”‘’:=(\[]*(?:(?:approximately|about|around|roughly|exactly|only|just|nearly|almost)\s+)?"
    rf"(?:[a-zA-Z]\s*=\s*)?{_SIGNED}(?![0-9])"
)
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[0-9.,]+)\s*\}\s*\{\s*(-?[0-9.,]+)\s*\}")
_LATEX_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]{0,200})\}")
_LATEX_DROP = re.compile(r"\\[!,;: ]|\\left|\\right|\{,\}")
_MAX_DIGITS = 40


def _delatex(text: str) -> str:
    """Plain-text form of the LaTeX that wraps numbers: \\frac{3}{4} -> 3/4, 1{,}080 -> 1,080."""
    if "\\" not in text and "{" not in text:
        return text
    text = _FRAC.sub(r"\1/\2", text)
    text = _LATEX_TEXT.sub(r"\1", text)
    text = _LATEX_DROP.sub(lambda m: "," if m.group() == "{,}" else "", text)
    return text.replace("\\$", "$").replace("\\%", "%").replace("\\(", " ").replace("\\)", " ")


_INTEGER = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


_THOUSANDS = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])")


def _fraction(text: str) -> Fraction | None:
    """Exact value of '1,080', '-7', '0.75', '3/4', '$18'; None when it is not such a number
    ('18, 14, 7' is a list: a comma separates thousands only in groups of three digits)."""
    s = text.replace("$", "").replace(" ", "").replace("−", "-")
    if "," in s:
        if _THOUSANDS.sub("", s).count(",") or not _THOUSANDS.search(s):
            return None
        s = s.replace(",", "")
    if not s:
        return None
    if _INTEGER.fullmatch(s):  # most answers: int() is many times faster than Fraction(str)
        return Fraction(int(s)) if len(s.lstrip("-")) <= _MAX_DIGITS else None
    if sum(c.isdigit() for c in s) > _MAX_DIGITS:
        return None
    num, _, den = s.partition("/")
    if not all(_DECIMAL.fullmatch(p) for p in (num, den or "0")):
        return None
    value = Fraction(num)
    if den:
        d = Fraction(den)
        if d == 0:
            return None
        value /= d
    return value


def _terminates(f: Fraction) -> bool:
    d = f.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def format_number(f: Fraction) -> str:
    """Canonical text of a number: 1080, -7, 0.75, 1/3."""
    if f.denominator == 1:
        return str(f.numerator)
    if not _terminates(f):
        return f"{f.numerator}/{f.denominator}"
    sign = "-" if f < 0 else ""
    f = abs(f)
    places = 0
    while (f * 10**places).denominator != 1:
        places += 1
    digits = str((f * 10**places).numerator).rjust(places + 1, "0")
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def canonical_number(text: str) -> str | None:
    """'1,080' -> '1080', '39.0' -> '39', '0.3333333333333333' -> '1/3' (a float's repeating decimal)."""
    f = _fraction(text)
    if f is None:
        return None
    decimals = text.partition(".")[2]
    if len(decimals) >= 10 and "/" not in text:
        near = f.limit_denominator(1000)
        if abs(near - f) < Fraction(1, 10**9):
            f = near
    return format_number(f)


def _number_from(m: re.Match) -> str | None:
    text = m.group("sign").replace("−", "-") + m.group("num")
    if m.group("den"):
        text += "/" + m.group("den")
    return canonical_number(text)


_WORDS_AT = re.compile(r"(?i)(?:minus\s+|negative\s+)?[a-z]+(?:(?:\s+|-)(?:and\s+)?[a-z]+){0,7}")
_OPERATOR_AFTER = re.compile(r"\s*(?:[-+*/×÷^x]|=)\s*[-−(]?[0-9$]")


def _number_word_at(span: str) -> str | None:
    """'thirty-seven' -> '37', 'one hundred and two' -> '102' (text2num), at the start of span."""
    m = _WORDS_AT.match(span)
    if not m:
        return None
    from text_to_num import text2num

    words = m.group().lower().split()
    sign = "-" if words[0] in ("minus", "negative") else ""
    words = words[1:] if sign else words
    if "point" in words[1:]:  # "nine point eight": a decimal point between number words
        return _decimal_words(words, sign)
    for n in range(len(words), 0, -1):
        if words[n - 1] == "and":
            continue
        try:
            value = text2num(" ".join(words[:n]), "en")
        except (ValueError, TypeError):
            continue
        return canonical_number(f"{sign}{value}")
    return None


def _decimal_words(words: list[str], sign: str) -> str | None:
    from text_to_num import alpha2digit

    m = re.match(r"[0-9]+\.[0-9]+(?![0-9])", alpha2digit(" ".join(words), "en"))
    return canonical_number(sign + m.group()) if m else None


# A step label before a value ("Step 2: They have 212 books."): not the answer's number.
_STEP_LABEL = re.compile(r"(?:[\s*_#]*(?i:step|part)\s+[0-9]+\s*[:.)]\**\s*)?")
# A sentence that concludes ("Therefore, there are 3 more birds."): of a value that holds several
# sentences, the last one that concludes states the answer.
_CONCLUDES = re.compile(
    r"[\s*_]*(?:Therefore|Thus|Hence|So|In total|Altogether|Overall|In conclusion|Finally)\b"
)
_SENTENCE_BREAK = re.compile(rf"(?<=[a-z0-9%)\]'\"”]){_NOT_A_TITLE}[.!?]\s+(?=[A-Z(*])")


def _concluding(line: str) -> str:
    """Of a line of several sentences, the last one that concludes; else the line itself."""
    sentences = _SENTENCE_BREAK.split(line)
    ends = [s for s in sentences[1:] if _CONCLUDES.match(s)]
    return ends[-1] if ends else line


def _number_at(span: str, choices: Choices = None, working: str = "") -> str | None:
    """The number a statement states: at its start ("$1,080", "x = 5", "thirty-seven", "nine
    point eight"); the result of an expression it starts with ("5 + 3 = 8"); else the one number
    its sentence holds, or the number of a sentence that restates the answer. `working`: the
    text before the statement, whose computed results pick one of several numbers."""
    capital = _delatex(span).lstrip(_STRIP + ":")[:1].isupper()  # before "Therefore," goes
    span = _unhedged(_delatex(span))
    span = span[_matched(_STEP_LABEL, span).end() :]
    capital = capital or span[:1].isupper()
    if not _NUMBER_AT.match(span) and _number_word_at(span) is None:  # a value in sentences
        span = _unhedged(_concluding(span.split("\n", 1)[0]))
    sentence = _first_sentence(span)
    m = _NUMBER_AT.match(span)
    values = {_number_from(x) for x in _NUMBER.finditer(sentence)} - {None}
    if m:
        after = span[m.end() :]
        if "=" in sentence and _OPERATOR_AFTER.match(after):
            last = _NUMBER_AT.match(sentence.rpartition("=")[2])
            return _number_from(last) if last else None
        first = _number_from(m)
        if len(values) > 1 and re.match(r"\s+[a-zA-Z]", after):  # "45 bags contain 1035 pounds"
            return _latest_computed(values, working) or first
        return first
    word = _number_word_at(span)
    if word is not None:
        return word
    if len(values) == 1:
        return values.pop()
    return _restated_number(sentence, working, capital) if values else None


def _latest_computed(values: set[str | None], working: str) -> str | None:
    """Of several numbers a sentence names, the one the working computed last (the newest
    result of an "="), if any of them is one."""
    text = _delatex(working[-4 * _SPAN_CHARS :])
    for eq in reversed(list(re.finditer("=", text))):
        m = _NUMBER_AT.match(text, eq.end())
        if not m or _OPERATOR_AFTER.match(text, m.end()):
            continue  # "= 3 x $1.54": an expression, not its result
        left = re.split(r"[=\n]", text[: eq.start()])[-1]
        if _ARITHMETIC.search(left) and _number_from(m) in values:
            return _number_from(m)
    return None


_ARITHMETIC = re.compile(r"[0-9)]\s*[-+*/×÷x^]\s*[($]?[0-9]")  # "45 x 23", "(8 + 2) / 5"


_COPULA = re.compile(r"\s(?:is|are|was|were|equals|(?:will|would)\s+be)\b")
_LEADING_CLAUSE = re.compile(r"[A-Z][^,\n]{0,60}?[0-9][^,\n]{0,40},\s+(?=[a-zA-Z])")


def _restated_number(sentence: str, working: str = "", capital: bool = False) -> str | None:
    """The number of an answer restated as a sentence of its own ("Answer:\nKaren earns $120 in
    two days if she works 3 hours per day."): the result of its last "=", else the one of its
    numbers that the working computed last, else the number right after its verb "is" ("the
    profit from 20 candles is $30"), else its first number after an opening clause ("After 10
    years, Tom has 91 trees" gives 91)."""
    if not (capital or sentence[:1].isupper()):
        return None
    if "=" in sentence:
        m = _NUMBER_AT.match(sentence.rpartition("=")[2])
        return _number_from(m) if m else None
    computed = _latest_computed({_number_from(x) for x in _NUMBER.finditer(sentence)}, working)
    if computed is not None:
        return computed
    for verb in _COPULA.finditer(sentence):  # "... from selling 20 candles is $30.00"
        m = _NUMBER_AT.match(sentence, verb.end())
        if m:
            return _number_from(m)
    m = _LEADING_CLAUSE.match(sentence)
    first = _NUMBER.search(sentence, m.end() if m else 0)
    return _number_from(first) if first else None


# A closing sentence that hedges, negates or asks does not state an answer.
_NOT_STATED = re.compile(r"(?i)\b(?:not|no|never|cannot|can't|isn't|if|unless|whether)\b|n't\b|\?")


def _closing_sentence(text: str) -> tuple[str, str] | None:
    """The last sentence of a text, when it is prose that could restate the answer ("So there
    are 5 rats in each cage."): capitalised, three words or more, not a question, a condition
    or a negation; with the text before it. None otherwise."""
    tail = text.rstrip()[-2 * _SPAN_CHARS :]
    lines = [ln for ln in tail.split("\n") if ln.strip(_DECOR)]
    if not lines:
        return None
    sentence = _SENTENCE_BREAK.split(lines[-1].strip(_DECOR))[-1]
    prose = sentence[:1].isupper() and len(re.findall(r"[A-Za-z]{2,}", sentence)) >= 3
    if not prose or _NOT_STATED.search(sentence):
        return None
    return sentence, text[: text.rfind(sentence)]


def _number_closing(text: str, choices: Choices = None) -> tuple[str, str] | None:
    found = _closing_sentence(text)
    if found is None:
        return None
    value = _number_at(found[0], choices, found[1])
    return (value, found[0]) if value is not None else None


def _newest(
    matches: Iterable[re.Match], read: Callable[[re.Match], str | None], keep: int = _MAX_CANDIDATES
) -> str | None:
    """The value of the newest match that reads as one, of the last `keep` matches."""
    for m in reversed(deque(matches, maxlen=keep)):
        value = read(m)
        if value is not None:
            return value
    return None


def _number_last(text: str, choices: Choices = None) -> str | None:
    return _newest(_NUMBER.finditer(_delatex(text)), _number_from)


def _number_equivalent(pred: str, gold: str) -> bool:
    p, g = _fraction(_delatex(pred)), _fraction(_delatex(gold))
    if p is None or g is None:
        return False
    if p == g:
        return True
    # A repeating gold (1/6) is matched by its rounding to the prediction's own decimals (0.17).
    places = len(pred.partition(".")[2]) if "/" not in pred else 0
    return not _terminates(g) and places >= 2 and round(g, places) == p


# --- multiple choice -------------------------------------------------------------------------------

LETTERS = "ABCDEFGHIJKLMNOPQR"  # option labels, in order
_CHOICE_AT = re.compile(
    r"[\s*_`'\"“”‘’:=(\[]*?(?:(?i:option|choice)\s*:?\s*)?"
    r"(?:\((?P<p>[A-Ra-r])\)|\[(?P<b>[A-R])\]|(?P<l>[A-HJ-R]|I(?=\s*(?:[.,;:)!]|$)))(?![\w'’-]))"
)
_OPS = r"→=<>+*/^&|∧∨¬~-"
_CHOICE_ANY = re.compile(
    r"(?<![\w)\]])\((?P<p>[A-R])\)"  # not P(B), f(A)
    rf"|(?:^|(?<=[\s*]))(?<![{_OPS}]\s)(?P<c>[A-R])\)"  # "B) 12", not "(A → B)"
    r"|(?i:answer|ans|option|choice)\b(?:\s+is\b)?(?:\s*[:,\-–])?[\s*_]*\(?(?P<a>[A-R])(?![\w'’-])"
    r"|\b(?P<s>[A-R])\s+is\s+(?:the\s+)?(?:correct|right|answer|best)"
)
_DATE = re.compile(r"(?<![0-9/])([0-9]{1,2})/([0-9]{1,2})/([0-9]{4})(?![0-9/])")


def _valid_letter(letter: str | None, choices: Choices) -> str | None:
    if not letter:
        return None
    letter = letter.upper()
    if choices is not None and LETTERS.find(letter) >= len(choices):
        return None
    return letter


def _norm_text(text: str) -> str:
    """Lowercase words, numbers and canonical dates, for matching an answer against the options."""
    text = _DATE.sub(lambda m: _date_text(m) or m.group(), text.lower())
    text = re.sub(r"(?<![0-9])\.|\.(?![0-9])|[^\w/.\s]", " ", text)
    text = re.sub(r"([0-9])([a-z])", r"\1 \2", text)
    return " ".join(text.split())


def _as_option(text: str) -> str:
    """A pattern of an option's text as a whole (not inside a word or a number)."""
    return rf"(?<![\w.]){re.escape(text)}(?![\w]|\.[0-9])"


def _find_option(said: str, options: Sequence[str]) -> str | None:
    """The option whose text occurs last in `said` (the longer one when two end together)."""
    best: tuple[int, int] = (-1, 0)
    letter: str | None = None
    for i, option in enumerate(options[: len(LETTERS)]):
        if not option:
            continue
        ends = [m.end() for m in re.finditer(_as_option(option), said)]
        if not ends:
            continue
        key = (ends[-1], len(option))
        if key > best:
            best, letter = key, LETTERS[i]
        elif key == best:
            letter = None  # two options end at the same place with the same length: ambiguous
    return letter


def _option_number(text: str, choices: Sequence[str]) -> str | None:
    """The option whose number equals `text`'s number ("200" names "$200.00"), if exactly one does."""
    value = _fraction(text) if text else None
    if value is None:
        return None
    starts = [_NUMBER_AT.match(_delatex(option)) for option in choices[: len(LETTERS)]]
    hits = [i for i, m in enumerate(starts) if m and _fraction(_number_from(m) or "") == value]
    return LETTERS[hits[0]] if len(hits) == 1 else None


def _named_options(said: str, options: Sequence[str]) -> set[int]:
    """Indices of the options whose (normalised) text occurs in `said`."""
    named = {i for i, o in enumerate(options) if o and re.search(_as_option(o), said)}
    # "blue ball" inside a named "dark blue ball" is not a second answer; nor is a repeated text.
    named = {i for i in named if not any(j != i and options[i] in options[j] for j in named)}
    return named if len({options[i] for i in named}) == len(named) else set()


def _option_in(sentence: str, choices: Sequence[str]) -> str | None:
    """The letter of the one option a stated answer names, by its text or by its number."""
    said = _norm_text(sentence[:_SPAN_CHARS])
    if not said:
        return None
    options = [_norm_text(c)[:_SPAN_CHARS] for c in choices[: len(LETTERS)]]
    named = _named_options(said, options)
    if len(named) == 1:
        return LETTERS[named.pop()]
    if named:
        return None  # two different options named: no answer
    return _option_number(_number_at(sentence) or "", choices)


_LETTER_TOKEN = r"(?:(?i:option|choice)\s+)?(?:\([A-Ra-r]\)|(?<![\w(])[A-HJ-R](?![\w'’(-]))"
_SEVERAL_LETTERS = re.compile(
    rf"{_LETTER_TOKEN}(?:\s*(?:,|/|&|\band/or\b|\band\b|\bor\b|\bas\s+well\s+as\b)\s*"
    rf"(?:both\s+|either\s+)?{_LETTER_TOKEN})+"
)


def _several_choices(span: str, choices: Choices = None) -> str | None:
    """'(A) or (B)', 'both (A) and (C)', 'A and B are correct', two option texts: no answer."""
    sentence = _first_sentence(span)
    for m in _SEVERAL_LETTERS.finditer(sentence):
        letters = {x.upper() for x in re.findall(r"(?<![\w(])\(?([A-Ra-r])\)?(?![\w(])", m.group())}
        if len(letters) > 1:
            return ", ".join(f"({x})" for x in sorted(letters))
    if choices:  # "(B) wall (E) table": options listed with their texts
        for m in re.finditer(r"\(?\b([A-Ra-r])\)\s*", sentence):
            i = LETTERS.find(m.group(1).upper())
            rest = sentence[m.end() :]
            if 0 <= i < len(choices) and choices[i] and rest.lower().startswith(choices[i].lower()):
                after = rest[len(choices[i]) :]
                nxt = re.match(r"\s*[,;]?\s*(?:and\s+|or\s+)?\(?([A-Ra-r])\)", after)
                if nxt and nxt.group(1).upper() != m.group(1).upper():
                    return f"({m.group(1).upper()}), ({nxt.group(1).upper()})"
    if choices and not _CHOICE_AT.match(_unhedged(span)):
        said = _norm_text(sentence[:_SPAN_CHARS])
        named = _named_options(said, [_norm_text(c)[:_SPAN_CHARS] for c in choices[: len(LETTERS)]])
        if len(named) > 1:
            return ", ".join(f"({LETTERS[i]})" for i in sorted(named))
    return None


def _choice_closing(text: str, choices: Choices = None) -> tuple[str, str] | None:
    """The one option letter a closing sentence names ("Therefore, the most appropriate
    objective is (D).", "... is given by option (I).")."""
    found = _closing_sentence(text)
    if found is None:
        return None
    marked = r"\((?P<p>[A-R])\)|(?i:option|choice)\s+\(?(?P<o>[A-R])\b"
    letters = {m.group("p") or m.group("o") for m in re.finditer(marked, found[0])}
    letter = _valid_letter(letters.pop(), choices) if len(letters) == 1 else None
    return (letter, found[0]) if letter else None


def _choice_at(span: str, choices: Choices = None) -> str | None:
    span = _unhedged(span)
    m = _CHOICE_AT.match(span)
    letter = _valid_letter(m and (m.group("p") or m.group("b") or m.group("l")), choices)
    if letter or not choices:
        return letter
    sentence = re.split(r"\.(?:\s|$)|\n", span, maxsplit=1)[0]
    return _option_in(sentence, choices)


def _choice_last(text: str, choices: Choices = None) -> str | None:
    m = _LAST_LINE_LETTER.search(text.rstrip()[-_SPAN_CHARS:])
    if m and _valid_letter(m.group(1), choices):
        return m.group(1)
    # one named group of _CHOICE_ANY holds the letter: the one its alternative has
    letter = _newest(
        _CHOICE_ANY.finditer(text), lambda m: _valid_letter(m[m.lastgroup or 0], choices)
    )
    if letter or not choices:
        return letter
    return _find_option(_norm_text(text), [_norm_text(c) for c in choices]) or _option_number(
        _number_last(text) or "", choices
    )


# --- yes/no, true/false, valid/invalid ----------------------------------------------------------------


_WORDS = {
    "yes_no": ("yes", "no"),
    "true_false": ("true", "false"),
    "valid_invalid": ("valid", "invalid"),
}


def _word_extractor(kind: str) -> Extractor:
    """The extractor of a two-word answer type. For yes/no, a word found outside a statement
    counts only when punctuation or the end follows it ("Yes, it is...", not "no one")."""
    alt = "|".join(_WORDS[kind])
    at = re.compile(r"[\s*_`'\"“”‘’:=(\[]*(?i:(" + alt + r"))\b")
    follow = r"(?=\s*(?:[,.!;:)\]*\"'”]|$))" if kind == "yes_no" else ""
    anywhere = re.compile(r"(?i:\b(" + alt + r")\b" + follow + ")")
    # "yes or no", "yes/no", "neither yes nor no", "partially yes and partially no"; not "yes,
    # and no one minds" (a determiner "no")
    both = re.compile(
        r"(?i)\b("
        + alt
        + r")\b(?:\s*/\s*|[^.;\n]{0,30}?\b(?:or|and|nor)\b[^.;\n]{0,20}?\b)("
        + alt
        + r")\b(?!\s+(?:one|longer|doubt|matter|more|less|way|need|reason|problem)\b)"
    )

    def parse_at(span: str, choices: Choices = None) -> str | None:
        m = at.match(_unhedged(_delatex(span)))
        return m.group(1).lower() if m else None

    def last(text: str, choices: Choices = None) -> str | None:
        found = deque(anywhere.finditer(text), maxlen=1)
        return found[0].group(1).lower() if found else None

    def several(span: str, choices: Choices = None) -> str | None:
        m = both.search(_first_sentence(span))
        if m and m.group(1).lower() != m.group(2).lower():
            return f"{m.group(1).lower()}, {m.group(2).lower()}"
        return None

    opening = re.compile(r"[\s*_`'\"“”‘’>#]*(?i:(" + alt + r"))\b[*_]*(?=\s*[,.!;:]|\s*$)")

    def closing(text: str, choices: Choices = None) -> tuple[str, str] | None:
        """The word opening the closing paragraph ("No, Shiva's dance is not a fitness pose.")."""
        lines = [ln for ln in text.rstrip()[-2 * _SPAN_CHARS :].split("\n") if ln.strip(_DECOR)]
        m = opening.match(lines[-1]) if lines else None
        if m is None or several(lines[-1]):
            return None
        return m.group(1).lower(), lines[-1]

    return Extractor(kind, 4, (kind,), parse_at, last, several=several, closing=closing)


# --- free strings --------------------------------------------------------------------------------------

_STRIP = " \t*_`'\"“”‘’"
_QUOTED = re.compile(r"\"([^\"\n]{1,300})\"|“([^”\n]{1,300})”")


def canonical_string(text: str) -> str | None:
    """Lowercase, no surrounding quotes or markdown, no final period, single spaces."""
    s, prev = " ".join(text.split()).lower(), None
    # to a fixed point, so canonical_string(canonical_string(x)) == canonical_string(x)
    while s != prev:
        prev, s = s, s.strip(_STRIP).rstrip(".,;:!")
    return s if s and len(s) <= _SPAN_CHARS else None


def _string_at(span: str, choices: Choices = None) -> str | None:
    sentence = re.split(r"(?<=[^\s.])\.(?:\s|$)", span.split("\n", 1)[0], maxsplit=1)[0]
    return canonical_string(sentence)


# "The concatenated last letters are: nyoa.", 'The sorted words are "a b c".': the value after
# the verb of a closing sentence, when it is one word, quoted, or after a colon.
_STATED_VALUE = re.compile(
    r"\s(?:is|are)\s*(?::\s*(?P<c>[^\n]+?)|[*_]*[\"“](?P<q>[^\"”\n]+)[\"”][*_]*|[*_]*(?P<w>\w+)[*_]*)"
    r"[.!]?\s*$"
)


def _string_closing(text: str, choices: Choices = None) -> tuple[str, str] | None:
    found = _closing_sentence(text)
    pronoun = found and re.match(r"(?:This|That|It|There)\b", found[0])
    m = _STATED_VALUE.search(found[0]) if found and not pronoun else None
    if m is None or found is None:
        return None
    value = canonical_string(m.group("c") or m.group("q") or m.group("w"))
    return (value, found[0]) if value else None


def _string_last(text: str, choices: Choices = None) -> str | None:
    lines = [ln for ln in text[-4 * _SPAN_CHARS :].split("\n") if ln.strip()]
    if not lines:
        return None
    line = lines[-1]
    quoted = deque(_QUOTED.finditer(line), maxlen=1)
    if quoted:
        return canonical_string(quoted[0].group(1) or quoted[0].group(2))
    return canonical_string(line.rpartition(":")[2])


def _string_key(s: str) -> str:
    # Spaces around brackets and punctuation do not matter: "] ) }" is "])}" (dyck_languages);
    # letters spelled out one by one are one word: "n y t n" is "nytn" (not "n, y, t, n").
    if re.fullmatch(r"\w(?:\s+\w)+", s):
        return re.sub(r"\s+", "", s)
    return re.sub(r"\s*([^\w\s])\s*", r"\1", s)


# --- dates ---------------------------------------------------------------------------------------------


def _date_text(m: re.Match) -> str | None:
    month, day, year = int(m.group(1)), int(m.group(2)), int(m.group(3))
    return f"{month:02d}/{day:02d}/{year:04d}" if 1 <= month <= 12 and 1 <= day <= 31 else None


def canonical_date(text: str) -> str | None:
    m = _DATE.fullmatch(text.strip())
    return _date_text(m) if m else None


_DATE_LEAD = re.compile(r"[\s*_`'\"“”‘’:=(\[]*")


def _date_at(span: str, choices: Choices = None) -> str | None:
    m = _DATE.match(span, _matched(_DATE_LEAD, span).end())
    return _date_text(m) if m else None


def _date_last(text: str, choices: Choices = None) -> str | None:
    return _newest(_DATE.finditer(text), _date_text)


# --- LaTeX answers (MATH) ----------------------------------------------------------------------------

_DOLLARS = re.compile(r"\$\$?([^$]{1,1000}?)\$\$?|\\\((.{1,1000}?)\\\)")


def canonical_math(text: str) -> str | None:
    s = text.strip().strip("$").strip()
    if s.startswith("\\boxed"):
        m = _BOXED.match(s)
        inner = _braced(s, m.end()) if m else None
        s = inner.strip() if inner is not None else s
    s = re.sub(r"[.\s]+$", "", s)
    return s if s and len(s) <= 1000 else None


_INLINE_JOIN = re.compile(r"[ \t]*(?:,|;|\band\b|\bor\b)[ \t]*")


def _math_at(span: str, choices: Choices = None, restated: bool = True) -> str | None:
    m = _DOLLARS.search(span)
    if m and not span[: m.start()].strip(_STRIP + ":"):
        # "$x = 3$ and $y = 5$": formulas joined in one sentence are one answer, a list (as
        # boxes on one line are)
        parts = [m.group(1) or m.group(2)]
        while (join := _INLINE_JOIN.match(span, m.end())) and (
            nxt := _DOLLARS.match(span, join.end())
        ):
            parts.append(nxt.group(1) or nxt.group(2))
            m = nxt
        return canonical_math(", ".join(parts))
    value = canonical_math(re.split(r"\.(?:\s|$)", span, maxsplit=1)[0].strip(_STRIP))
    # "The answer is positive, because ..." is prose, not an answer: at most three plain words.
    prose = re.findall(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}", _LATEX_TEXT.sub("", value or ""))
    if len(prose) <= 3:
        return value
    # a value restated as a sentence whose subject names it ("The minimum value is $3$,
    # attained at $x = 1$."): the mathematics after its verb
    restating = _RESTATED.match(span) if restated else None
    if restating is None:
        return None
    found = _math_at(_unhedged(span[restating.end() :]), choices, restated=False)
    return found if found and re.search(r"[0-9\\]", found) else None


# a sentence's subject that names the value (a determiner, then words; no clause) and its verb
_RESTATED = re.compile(
    r"[\s*_]*(?:the|this|our|its|their|his|her|my)\s+[^\W\d_][^,;:$()\n.]{0,80}?\s(?:is|are|equals)\s",
    re.IGNORECASE,
)


def _math_closing(text: str, choices: Choices = None) -> tuple[str, str] | None:
    """The value after the last "is" of a closing sentence ("Therefore, the value of
    \\( n \\) is **7**."), when it is mathematics (a digit or a LaTeX command)."""
    found = _closing_sentence(text)
    verbs = deque(re.finditer(r"\s(?:is|are|equals)\s", found[0]), maxlen=1) if found else ()
    if not verbs or found is None:
        return None
    value = _math_at(_unhedged(found[0][verbs[0].end() :]))
    return (value, found[0]) if value and re.search(r"[0-9\\]", value) else None


def _math_last(text: str, choices: Choices = None) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return canonical_math(boxed)
    inline = deque(_DOLLARS.finditer(text), maxlen=1)
    if inline:
        return canonical_math(inline[0].group(1) or inline[0].group(2))
    return _number_last(text)


_LATEX_NOISE = re.compile(r"\\left|\\right|\\[!,;: ]|\^\{?\\circ\}?|\\%|%|\$|\s+")


def _latex_key(s: str) -> str:
    s = _LATEX_TEXT.sub(r"\1", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return _LATEX_NOISE.sub("", s).rstrip(".")


# Math-Verify is called without its timeouts: they are a SIGALRM after 5 s of wall clock, so a
# pair near the limit scored differently on a busy machine than on an idle one (and they work in
# the main thread only). The work is bounded by the input instead: at most MV_MAX_CHARS characters
# (checked by the caller), no number the parser would build past MV_MAX_DIGITS digits (a power
# tower, a large factorial), and no symbolic simplification of a parsed expression larger than
# MV_MAX_OPS operations. A verdict is then a function of the two answers alone.
MV_MAX_CHARS = 500
MV_MAX_DIGITS = 2000
MV_MAX_OPS = 100
_POWER = re.compile(r"(\d+(?:\.\d+)?)\s*\^\s*\{?\s*(\d+(?:\.\d+)?)\s*\}?(?!\s*\^)")
_FACTORIAL = re.compile(r"(\d+)\s*!")


def _mv_bounded(text: str) -> bool:
    """Whether Math-Verify's parser can read `text` without building a huge number: no power
    tower (a^{b^c}), no power or factorial whose value would pass MV_MAX_DIGITS digits."""
    if re.search(r"\^\s*\{[^{}]*\^", text) or re.search(r"\^\s*[0-9a-z]\s*\^", text):
        return False
    for base, exp in _POWER.findall(text):
        b, e = float(base), float(exp)
        if b > 1 and e * math.log10(b) > MV_MAX_DIGITS:
            return False
    # n! has about n log10(n / e) digits
    return all(int(n) < 1000 for n in _FACTORIAL.findall(text))


@functools.lru_cache(maxsize=8192)
def _mv_parse(text: str, units: bool) -> tuple:
    """Math-Verify's reading of an answer (no timeout: see MV_MAX_CHARS). Its unit normalisation
    (`units`) also drops letters that are variables (the m of \\frac{37}{4}m), so it is used only
    where a task strips units."""
    import logging

    from latex2sympy2_extended.math_normalization import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse

    # its warning that no timeout is set is what is meant here
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    norm = NormalizationConfig(basic_latex=True, units=units, malformed_operators=True, nits=True,
                               boxed="all", equations=False)  # fmt: skip
    config = [LatexExtractionConfig(normalization_config=norm)]
    return tuple(parse("\\boxed{" + text + "}", config, parsing_timeout=None))


def _mv_small(parsed: tuple) -> bool:
    """Whether every parsed expression is small enough for symbolic comparison (MV_MAX_OPS)."""
    from sympy import Basic

    return all(not isinstance(x, Basic) or x.count_ops() <= MV_MAX_OPS for x in parsed)


@functools.lru_cache(maxsize=8192)
def _mv_verify(gold: str, pred: str, units: bool) -> bool:
    from math_verify import verify

    gold_parsed, pred_parsed = _mv_parse(gold, units), _mv_parse(pred, units)
    if not (gold_parsed and pred_parsed and _mv_small(gold_parsed) and _mv_small(pred_parsed)):
        return False
    return verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None)


# 1e-5, 2.5E+3: scientific notation as LaTeX writes it (Math-Verify reads "e" as Euler's number)
_E_NOTATION = re.compile(r"(?<![\w.])([0-9]+(?:\.[0-9]+)?)[eE]([-+]?[0-9]+)(?![\w.])")
# an ordinal's suffix: 12^{\mathrm{th}}, 3^\text{rd}, 21st
_ORDINAL = re.compile(
    r"(?<=[0-9])\s*(?:\^\s*)?(?:\{\s*)?(?:\\(?:mathrm|text|textrm|rm)\s*\{?\s*)?(?:th|st|nd|rd)\b\s*\}?\s*\}?"
)
# a unit after a value: \text{ cm}, \,\mathrm{kcal\,m}^{-2}, \text{ grade}
_UNIT_TAIL = re.compile(
    r"(?:\s|\\[,;:! ])*\\(?:text|textrm|mathrm|mbox|rm)\s*\{[^{}]{0,60}\}"
    r"(?:\s*\^\s*(?:\{[^{}]{0,10}\}|-?[0-9a-z]))?(?:\s|\\[,;:! ])*$"
)
_TOP_LEVEL_LIST = re.compile(r"[^()\[\]{}]*,[^()\[\]{}]*")


def _math_form(s: str, ordered: bool, strip_units: bool) -> str:
    """An answer rewritten for Math-Verify: scientific notation as \\times 10^{n}, no ordinal
    suffix, no unit after the value (where the task strips units), a bare list as a tuple (where
    its order matters)."""
    s = _E_NOTATION.sub(r"\1\\times 10^{\2}", s.strip())
    # the degree sign as LaTeX writes it: 700°C is 700^{\circ}\text{C}
    s = re.sub(
        r"\s*°\s*([CFK]\b)?", lambda m: "^{\\circ}" + (f"\\text{{{m[1]}}}" if m[1] else ""), s
    )
    s = _ORDINAL.sub("", s)
    if strip_units:
        for _ in range(3):
            bare = _UNIT_TAIL.sub("", s)
            if bare == s or not re.search(r"[0-9]", bare):
                break
            s = bare
    if ordered and _TOP_LEVEL_LIST.fullmatch(s) and _fraction(_delatex(s)) is None:
        s = f"({s})"
    return s


_RELATION = re.compile(r"<|>|≤|≥|≠|\\(?:leq?|geq?|neq|ne|in|notin|subset)\b")
# a condition after the value: "\\text{ for all } n > 0", ", \\quad n \\geq 1", "(k \\in \\mathbb{Z})"
_CONDITION = re.compile(
    r"\s*(?:\\text\s*\{\s*(?:for|where|when|if|with|provided|assuming)\b.*"
    r"|(?:,|;|\\q?quad|\\[,;: ])\s*\(?[^=()]*(?:<|>|≤|≥|≠|\\(?:leq?|geq?|neq|ne|in)\b)[^=()]*\)?"
    r"|\s\([^=()]*(?:<|>|≤|≥|≠|\\(?:leq?|geq?|neq|ne|in)\b)[^=()]*\))\s*$"
)
_LABEL = re.compile(r"\s*[A-Za-z](?:_\{?[0-9A-Za-z]{1,3}\}?)?\s*=\s*(?!=)")


def _as_the_gold_states(pred: str, gold: str) -> str:
    """The prediction in the gold's terms, where it adds what the gold does not state: a
    condition after its value ("3 \\text{ for all } n > 0", "5 \\quad (n \\geq 1)") when the gold
    states no relation, and the labels of a labelled list ("a = -2, b = -2") when the gold's
    list has none."""
    if not _RELATION.search(gold):
        bare = _CONDITION.sub("", pred)
        pred = bare if bare.strip() else pred
    parts = _top_level_parts(pred)
    if len(parts) > 1 and not _LABEL.match(gold) and all(_LABEL.match(x) for x in parts):
        pred = ", ".join(_LABEL.sub("", x, count=1).strip() for x in parts)
    return pred


def _top_level_parts(s: str) -> list[str]:
    """`s` split at its commas outside brackets and braces."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    return [*parts, s[start:]]


def _math_equivalent(
    pred: str, gold: str, ordered: bool = False, strip_units: bool = False
) -> bool:
    if _latex_key(pred) == _latex_key(gold):
        return True
    pred, gold = (_math_form(x, ordered, strip_units) for x in (pred, gold))
    pred = _as_the_gold_states(pred, gold)
    p, g = _fraction(_delatex(pred)), _fraction(_delatex(gold))
    if p is not None and g is not None:
        return p == g
    if max(len(pred), len(gold)) > MV_MAX_CHARS or not (_mv_bounded(pred) and _mv_bounded(gold)):
        return False
    if _text_words(pred) != _text_words(gold):  # Math-Verify reads past the words of \text{}
        return False
    for units in (False, True) if strip_units else (False,):
        try:
            if _mv_verify(gold, pred, units):
                return _close_as_stated(pred, gold)
        except Exception:  # Math-Verify's sympy layer can fail in many ways; none is a match.
            pass
    return False


_WORD = re.compile(r"[^\W\d_]{2,}")
_LIST_WORDS = frozenset({"and"})  # "3 and 4" lists what "3, 4" lists


def _text_words(s: str) -> list[str]:
    """The words of an answer's \\text{} groups (two letters or more, lower case, sorted), but
    the "and" of a list. Math-Verify's normalisation drops them, so "x is odd" equals "x is
    even" and "3 or 4" equals "3 and 4" there: two answers whose words differ are not equal."""
    words = (w.lower() for group in _LATEX_TEXT.findall(s) for w in _WORD.findall(group))
    return sorted(w for w in words if w not in _LIST_WORDS)


# a plain decimal number, optionally in scientific notation (as _math_form writes it)
_STATED = re.compile(
    r"\s*(-?)\s*(\d+)(?:\.(\d+))?\s*(?:(?:\\times|\\cdot)\s*10\s*\^\s*\{?\s*([-+]?\d+)\s*\}?)?\s*"
)


def _close_as_stated(pred: str, gold: str) -> bool:
    """Math-Verify rounds numbers to 6 decimal places, so any two below 5e-7 match (3.3e-22 and
    1.3e-27). Where both answers are plain decimal numbers, they must also agree to the precision
    one of them states: within half a unit of its last digit (0.001429 for 1/700's 0.00142857)."""
    found = [m for x in (pred, gold) if (m := _STATED.fullmatch(x))]
    if len(found) < 2:
        return True
    values, halves = [], []
    for m in found:
        sign, whole, frac, exp = m.groups()
        e = int(exp or 0)
        values.append(Fraction(f"{sign}{whole}.{frac or 0}") * Fraction(10) ** e)
        halves.append(Fraction(5) * Fraction(10) ** (e - len(frac or "") - 1))
    return abs(values[0] - values[1]) <= max(halves)


# --- the registry ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One reading of a completion: the answer, the rule that found it, the text it was read
    from, and, when there is no answer, why."""

    value: str | None
    rule: str | None = None
    span: str | None = None
    reason: str | None = None

    def fields(self, prefix: str) -> dict[str, str | None]:
        return {f"{prefix}_{k}": getattr(self, k) for k in ("rule", "span", "reason")}


def _clip(span: str) -> str:
    span = " ".join(span.split())
    return span if len(span) <= 120 else span[:117] + "..."


def _never(span: str, choices: Choices = None) -> None:
    return None


@dataclass(frozen=True)
class Extractor:
    """A named, versioned pair of readings of a completion; `answer_types` it can score.

    strict: the last explicit answer statement decides (no fallback to an earlier one); no
    statement, a statement naming several answers, or one whose value does not parse is no answer.
    flexible: the strict answer when there is one; several answers stay no answer; otherwise the
    newest earlier statement that parses; with no statement at all, the closing sentence
    (`closing`) when it gives a value, else the last candidate of the type anywhere."""

    name: str
    version: int
    answer_types: tuple[str, ...]
    parse_at: Callable[[str, Choices], str | None]  # a value at the start of a statement's span
    last: Callable[[str, Choices], str | None]  # the last candidate anywhere
    bare_ok: bool = False  # accept "Answer B" without "is" or ":"
    boxed_first: bool = False  # a \boxed{} answer wins over a later "answer is" phrase
    several: Callable[[str, Choices], str | None] = _never  # names two answers or more?
    # the answer of a closing sentence, read when the text has no answer statement
    closing: Callable[[str, Choices], tuple[str, str] | None] = _never
    working: bool = False  # parse_at also takes the text before the statement
    # reasoning-model output: a run of one repeated box is no answer, and a solution block cut off
    # before its close that states nothing falls back to the reasoning before it (scoring.score)
    reasoning_rules: bool = False

    def _value(self, st: Statement, choices: Choices, text: str) -> str | None:
        value = canonical(self.answer_types[0], st.span) if st.rule == "boxed" else None
        if value is not None:
            return value
        if self.working:
            return self.parse_at(st.span, choices, text[: st.pos])  # type: ignore[call-arg]
        return self.parse_at(st.span, choices)

    def read(
        self, text: str, choices: Choices = None, closing: bool = True
    ) -> tuple[Reading, Reading]:
        """(strict, flexible) readings of a completion, with rule, span and no-answer reason.
        `closing`: with no answer statement, the flexible reading tries the closing sentence
        (`Extractor.closing`) before the last candidate anywhere."""
        if not isinstance(text, str) or not text.strip():
            empty = Reading(None, reason="empty completion")
            return empty, empty
        text = _before_next_turn(text)
        kind = self.answer_types[0]
        statements = _statements(
            text, self.bare_ok, join_boxes=self.boxed_first, drop_loops=self.reasoning_rules
        )
        if self.boxed_first and not any(st.rule == "json_answer" for st in statements):
            boxed = [st for st in statements if st.rule == "boxed"]
            statements = [st for st in statements if st.rule != "boxed"] + boxed[-1:]
        strict: Reading
        if not statements:
            strict = Reading(None, reason="no answer statement")
        else:
            st = statements[-1]
            several = self.several(st.span, choices)
            if several:
                reason = f"several answers named: {several}"
                return (Reading(None, st.rule, _clip(st.span), reason),) * 2
            value = self._value(st, choices, text)
            if value is not None:
                strict = Reading(value, st.rule, _clip(st.span))
                return strict, strict
            strict = Reading(
                None, st.rule, _clip(st.span), f"the last answer statement names no {kind}"
            )
        for st in reversed(statements[:-1]):
            value = None if self.several(st.span, choices) else self._value(st, choices, text)
            if value is not None:
                return strict, Reading(value, f"earlier_{st.rule}", _clip(st.span))
        if statements:  # the model stated a non-answer: no guessing from the rest of the text
            return strict, Reading(None, reason=f"no answer statement names a {kind}")
        found = self.closing(text, choices) if closing else None
        if found is not None:  # "So there are 5 rats in each cage." closing the text
            return strict, Reading(found[0], "closing_sentence", _clip(found[1]))
        value = self.last(text, choices)
        if value is None:
            return strict, Reading(None, reason=f"no {kind} anywhere in the text")
        return strict, Reading(value, f"last_{kind}")

    def strict(self, text: str, choices: Choices = None) -> str | None:
        return self.read(text, choices)[0].value

    def flexible(self, text: str, choices: Choices = None) -> str | None:
        return self.read(text, choices)[1].value


EXTRACTORS: dict[str, Extractor] = {
    "number": Extractor(
        "number", 4, ("number",), _number_at, _number_last, closing=_number_closing, working=True
    ),
    "math": Extractor(
        "math",
        5,
        ("math", "number"),
        _math_at,
        _math_last,
        boxed_first=True,
        closing=_math_closing,
        reasoning_rules=True,
    ),  # fmt: skip
    "choice": Extractor(
        "choice",
        4,
        ("choice",),
        _choice_at,
        _choice_last,
        bare_ok=True,
        several=_several_choices,
        closing=_choice_closing,
    ),  # fmt: skip
    **{kind: _word_extractor(kind) for kind in _WORDS},
    "string": Extractor(
        "string", 5, ("string",), _string_at, _string_last, closing=_string_closing
    ),
    "date": Extractor("date", 3, ("date",), _date_at, _date_last),
}


def get_extractor(name: str) -> Extractor:
    if name not in EXTRACTORS:
        raise UserError(f"unknown extractor {name!r}; valid: {', '.join(sorted(EXTRACTORS))}.")
    return EXTRACTORS[name]


def canonical(answer_type: str, raw: object) -> str | None:
    """The canonical text of a gold or boxed answer of this type, or None when it does not parse."""
    if isinstance(raw, bool):
        raw = {"yes_no": ("yes" if raw else "no"), "true_false": str(raw).lower()}.get(answer_type)
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        raw = repr(raw)
    if not isinstance(raw, str):
        return None
    text = raw.strip()
    if answer_type == "number":
        m = _NUMBER_AT.match(_delatex(text))
        rest = _delatex(text)[m.end() :] if m else ""
        return _number_from(m) if m and not rest.strip(" .") else None
    if answer_type == "math":
        return canonical_math(text)
    if answer_type == "choice":
        m = re.fullmatch(r"[\s(\[]*([A-Ra-r])[\s)\].]*", text)
        return m.group(1).upper() if m else None
    if answer_type in _WORDS:
        word = text.strip(_STRIP + ".").lower()
        return word if word in _WORDS[answer_type] else None
    if answer_type == "string":
        return canonical_string(text)
    if answer_type == "date":
        return canonical_date(text)
    raise UserError(f"unknown answer type {answer_type!r}; valid: {', '.join(ANSWER_TYPES)}.")


def equivalent(
    answer_type: str,
    pred: str | None,
    gold: str | None,
    *,
    ordered: bool = False,
    strip_units: bool = False,
) -> bool:
    """Whether an extracted answer matches the gold answer under this answer type's rules.

    For math answers the task decides (tasks/<name>.yaml `scoring`) whether a bare list's order
    matters (`ordered`; tuples, intervals and matrices are always compared as such) and whether
    a unit after a value is left out (`strip_units`)."""
    if pred is None or gold is None:
        return False
    if answer_type == "number":
        return _number_equivalent(pred, gold)
    if answer_type == "math":
        return _math_equivalent(pred, gold, ordered, strip_units)
    if answer_type == "string":
        p, g = canonical_string(pred), canonical_string(gold)
        return p is not None and g is not None and _string_key(p) == _string_key(g)
    if answer_type == "date":
        return canonical_date(pred) is not None and canonical_date(pred) == canonical_date(gold)
    if answer_type in ANSWER_TYPES:
        return pred.strip().lower() == gold.strip().lower()
    raise UserError(f"unknown answer type {answer_type!r}; valid: {', '.join(ANSWER_TYPES)}.")
