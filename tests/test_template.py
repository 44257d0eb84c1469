"""Routine templates: ``{{ path }}`` placeholders, type-preserving rendering, variables()."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engrain._errors import EngrainError, TemplateError
from engrain._routines.template import escape, parse_path, placeholder, render, variables

SCOPE = {
    "inputs": {"url": "https://example.test/data.csv", "limit": 3, "flags": {"dry": False}},
    "step1": {"rows": [{"dept": "Sales", "amount": 10.5}, {"dept": "Ops", "amount": 2}], "count": 2},
    "name": "Ada",
    "items": [1, 2, 3],
    "nothing": None,
    "odd": {"has space": 1, "_private": 2, "0": "zero"},
}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ inputs.limit }}", 3),
        ("{{inputs.limit}}", 3),
        ("{{   inputs.limit   }}", 3),
        ("{{ step1.rows }}", SCOPE["step1"]["rows"]),
        ("{{ step1.rows[0] }}", {"dept": "Sales", "amount": 10.5}),
        ("{{ step1.rows[0].amount }}", 10.5),
        ("{{ step1.rows[-1].dept }}", "Ops"),
        ("{{ inputs.flags.dry }}", False),
        ("{{ nothing }}", None),
        ("{{ items }}", [1, 2, 3]),
        ('{{ odd["has space"] }}', 1),
        ("{{ odd['_private'] }}", 2),
        ('{{ odd["0"] }}', "zero"),
    ],
)
def test_whole_placeholder_keeps_the_type(template, expected):
    out = render(template, SCOPE)
    assert out == expected
    assert type(out) is type(expected)


def test_whole_value_is_the_same_object_not_a_copy():
    assert render("{{ step1.rows }}", SCOPE) is SCOPE["step1"]["rows"]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("Hello {{ name }}", "Hello Ada"),
        ("{{ name }}!", "Ada!"),
        ("{{ name }}{{ name }}", "AdaAda"),
        (" {{ inputs.limit }} ", " 3 "),
        ("limit={{ inputs.limit }}&dept={{ step1.rows[1].dept }}", "limit=3&dept=Ops"),
        ("rows: {{ items }}", "rows: [1, 2, 3]"),
        ("flag {{ inputs.flags.dry }} / {{ nothing }}", "flag false / null"),
        ("row {{ step1.rows[0] }}", 'row {"dept": "Sales", "amount": 10.5}'),
    ],
)
def test_placeholders_inside_text_interpolate(template, expected):
    assert render(template, SCOPE) == expected


def test_nested_dicts_and_lists_render_recursively():
    value = {
        "url": "{{ inputs.url }}",
        "query": {"limit": "{{ inputs.limit }}", "depts": ["{{ step1.rows[0].dept }}", "x-{{ step1.rows[1].dept }}"]},
        "static": [1, 2.5, True, None, "plain", {"k": "v"}],
        "{{ name }}": "keys are not templated",
    }
    out = render(value, SCOPE)
    assert out == {
        "url": "https://example.test/data.csv",
        "query": {"limit": 3, "depts": ["Sales", "x-Ops"]},
        "static": [1, 2.5, True, None, "plain", {"k": "v"}],
        "{{ name }}": "keys are not templated",
    }
    assert value["url"] == "{{ inputs.url }}"  # the template itself is untouched


def test_values_without_placeholders_pass_through():
    for v in (None, 1, 2.5, True, "", "plain text", "a } b { c", "JSON {\"a\": {\"b\": 1}}", [], {}):
        assert render(v, {}) == v


def test_close_braces_alone_are_text():
    assert render('{"a": {"b": "{{ name }}"}}', SCOPE) == '{"a": {"b": "Ada"}}'


def test_quoted_literal_and_escape_round_trip():
    assert render("{{ '{{' }} name }}", SCOPE) == "{{ name }}"
    assert render('{{ "}}" }}', SCOPE) == "}}"
    for text in ["{{ name }}", "a {{ b {{ c }} }}", "{{", "{{{", "}}{{", "x {{'}}' y", "plain"]:
        assert render(escape(text), SCOPE) == text
        assert variables(escape(text)) == set()
    assert render({"a": [escape("{{ x }}")]}, {}) == {"a": ["{{ x }}"]}


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("{{ missing }}", "undefined variable 'missing'"),
        ("{{ inputs.nope }}", "no key 'nope' in inputs"),
        ("{{ step1.rows[5] }}", "index 5 is out of range for step1.rows (length 2)"),
        ("{{ step1.rows[0].dept.x }}", "step1.rows[0].dept is a str, not a mapping"),
        ("{{ name[0] }}", "name is a str, not a list"),
        ("{{ step1.count.x }}", "step1.count is a int"),
        ("Hello {{ who }}", "undefined variable 'who'"),
        ('{{ odd["nope"] }}', "no key 'nope' in odd"),
    ],
)
def test_missing_paths_raise_a_typed_error_naming_them(template, fragment):
    with pytest.raises(TemplateError) as info:
        render({"args": {"url": template}}, SCOPE, where="step 'fetch' field 'args.url'")
    msg = str(info.value)
    assert fragment in msg
    assert msg.startswith("step 'fetch' field 'args.url': ")
    assert template in msg
    assert isinstance(info.value, EngrainError)


def test_undefined_variable_lists_what_is_defined():
    with pytest.raises(TemplateError, match=r"defined: a, b"):
        render("{{ c }}", {"a": 1, "b": 2})


def test_variables_finds_root_names_everywhere():
    value = {
        "a": "{{ inputs.url }}",
        "b": ["x {{ step1.rows[0].dept }} y {{ name }}", {"deep": ["{{ step2 }}"]}],
        "c": 5,
        "d": "{{ '{{' }} not_a_var }}",
    }
    assert variables(value) == {"inputs", "step1", "name", "step2"}
    assert variables("no placeholders") == set()
    assert variables([1, None, {"k": True}]) == set()


@pytest.mark.parametrize(
    "bad",
    [
        "{{ a..b }}",
        "{{ __class__ }}",
        "{{ a.__class__ }}",
        "{{ a._x }}",
        "{{ a + b }}",
        "{{ a() }}",
        "{{ a[b] }}",
        "{{ a[1 }}",
        "{{ a[] }}",
        "{{ }}",
        "{{ 1abc }}",
        "{{ a. }}",
        "{{ .a }}",
        "{{ a['x }}",
        "text {{ open",
        "{{ a } }}",
        "{{ 'lit' extra }}",
    ],
)
def test_bad_syntax_is_a_template_error(bad):
    with pytest.raises(TemplateError):
        variables(bad)
    with pytest.raises(TemplateError):
        render(bad, {"a": {"b": 1, "x": 1}, "b": 0})


def test_parse_path_and_placeholder():
    assert parse_path("step1.rows[0].dept") == ("step1", "rows", 0, "dept")
    assert parse_path(' a[ -1 ]["b c"] ') == ("a", -1, "b c")
    assert placeholder("step1.rows[0]") == "{{ step1.rows[0] }}"
    assert render(placeholder("step1.rows[1].amount"), SCOPE) == 2
    for bad in ("a..b", "_x", "a.__dict__", "", "a b", "'lit'"):
        with pytest.raises(TemplateError):
            parse_path(bad)
        with pytest.raises(TemplateError):
            placeholder(bad)


def test_paths_read_mapping_keys_never_attributes():
    class Obj:
        secret = "attr"

    with pytest.raises(TemplateError, match="not a mapping"):
        render("{{ o.secret }}", {"o": Obj()})
    with pytest.raises(TemplateError, match="not a mapping"):
        render("{{ o.real }}", {"o": 1 + 2j})


def test_repeated_render_uses_the_cache_and_stays_correct():
    t = "id={{ i }}"
    assert [render(t, {"i": i}) for i in range(5)] == [f"id={i}" for i in range(5)]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_escaped_json_values_render_to_themselves(value):
    def esc(v):
        if isinstance(v, str):
            return escape(v)
        if isinstance(v, list):
            return [esc(x) for x in v]
        if isinstance(v, dict):
            return {k: esc(x) for k, x in v.items()}
        return v

    assert render(esc(value), {}) == value
    assert variables(esc(value)) == set()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="{}[]'\". _abx0-", max_size=30))
def test_random_text_only_raises_template_error(text):
    try:
        names = variables(text)
    except TemplateError:
        return
    try:
        render(text, {n: {"a": [1], "b": "x"} for n in names})
    except TemplateError:
        pass


@settings(max_examples=100, deadline=None)
@given(json_values)
def test_whole_placeholder_returns_any_value_unchanged(value):
    assert render("{{ v }}", {"v": value}) == value
    assert render({"k": ["{{ v }}"]}, {"v": value}) == {"k": [value]}
