"""The agent turn's fast paths write and read exactly what the plain stdlib calls they stand for do.

Each turn parses the model's tool arguments, shows the tool's result to the model as text,
stamps the reply and writes the system message; these take shortcuts for the common case
(see ``engrain._agent.loop``, ``toolspec`` and ``providers``), checked here against
``json.loads``, ``json.dumps`` and ``datetime`` on ordinary and edge inputs.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import time

import pytest

from engrain._agent import providers
from engrain._agent.loop import MAX_RESULT, _content
from engrain._agent.toolspec import _parse

ARGUMENTS = [
    '{"a": 1, "b": 2}', "{}", "", ' {"a": 1} ', '{"a": 1}\n', '{"a": 1}{}', '{"a": NaN}', '{"a": 1e400}',
    "[1, 2]", '{"a":', '{"a": 1} x', '{"a": "\\ud800"}', '{"a": 1, "a": 2}', '{"n": 123456789012345678901234567890}',
    '{"a": {"b": [1, {"c": null}]}}', '"x"', "{", "}", '{"a": tru}', '\ufeff{"a": 1}',
]


def _outcome(fn, raw):
    try:
        return "ok", fn(raw)
    except ValueError as e:
        return "error", str(e)


@pytest.mark.parametrize("raw", ARGUMENTS)
def test_tool_arguments_parse_as_json_loads_does(raw):
    # repr: NaN is not equal to itself, and the error messages must be the same too
    assert repr(_outcome(_parse, raw)) == repr(_outcome(lambda r: json.loads(r or "{}"), raw))


@pytest.mark.parametrize("value", [0, 3, -7, 10**30, -(10**40), True, False, None, "text", 1.5, [1, "a"],
                                   {"k": [True, None]}, "é"])
def test_tool_results_show_as_json_dumps_writes(value):
    assert _content(value) == (value if isinstance(value, str) else json.dumps(value))


def test_a_long_result_is_cut_whatever_its_type():
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        text = _content(int("9" * (MAX_RESULT + 10)))
    finally:
        sys.set_int_max_str_digits(old)
    assert text == "9" * MAX_RESULT + f"... [truncated, {MAX_RESULT + 10} characters]"
    assert _content("x" * (MAX_RESULT + 1)) == "x" * MAX_RESULT + f"... [truncated, {MAX_RESULT + 1} characters]"


def test_reply_stamps_read_the_clock_as_datetime_does():
    for _ in range(200):
        before = dt.datetime.now(dt.timezone.utc)
        stamp = providers.utc_iso()
        after = dt.datetime.now(dt.timezone.utc)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp)
        got = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc)
        assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= got <= after
    given = dt.datetime(2026, 11, 23, 10, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert providers.utc_iso(given) == "2026-11-23T08:00:00.123Z"


def test_the_system_message_follows_the_clock_and_its_arguments():
    first = providers.system_text("Be brief.", "")
    now = dt.datetime.now(dt.timezone.utc)
    assert first.startswith("Be brief.\n\nCurrent time: ")
    shown = dt.datetime.strptime(first.split("Current time: ")[1][:20], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=dt.timezone.utc)
    assert abs((now - shown).total_seconds()) < 2
    other = providers.system_text("Be brief.", "What you remember: x")
    assert "What you remember: x" in other and "What you remember" not in providers.system_text("Be brief.")
    assert providers.system_text("Other.").startswith("Other.\n\n")
    sec = int(time.time())
    while int(time.time()) == sec:  # the next second: the time shown moves on
        time.sleep(0.01)
    later = providers.system_text("Be brief.", "")
    assert later.split("Current time: ")[1][:20] != first.split("Current time: ")[1][:20]
