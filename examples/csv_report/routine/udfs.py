"""UDFs compiled by engrain from a trace.

Each function replays the results recorded in the trace for the arguments it
was called with, and raises UnknownInputError for any other arguments: its real
behaviour could not be derived from the trace. Replace a function's body with
real code to generalize the routine.
"""

# Helpers reach builtins through _b: a UDF may be named dict, list, len or float.
import builtins as _b

try:
    from engrain import UnknownInputError
except ImportError:  # inside the UDF sandbox engrain is not importable

    class UnknownInputError(LookupError):
        def __init__(self, function, args):
            _b.LookupError.__init__(self, f"udfs.py: {function}() has no recorded result for arguments {args!r}")

_Unknown = UnknownInputError


def _same(a, b):
    """JSON equality that tells True from 1 and 1 from 1.0 apart."""
    if _b.isinstance(a, _b.dict) and _b.isinstance(b, _b.dict):
        return a.keys() == b.keys() and _b.all(_same(a[k], b[k]) for k in a)
    if _b.isinstance(a, _b.list) and _b.isinstance(b, _b.list):
        return _b.len(a) == _b.len(b) and _b.all(_same(x, y) for x, y in _b.zip(a, b))
    return _b.type(a) is _b.type(b) and a == b


def _copy(v):
    if _b.isinstance(v, _b.dict):
        return {k: _copy(x) for k, x in v.items()}
    if _b.isinstance(v, _b.list):
        return [_copy(x) for x in v]
    return v


def _replay(name, table, args):
    for seen, result in table:
        if _same(seen, args):
            return _copy(result)
    raise _Unknown(name, args)


_PARSE_CSV_CALLS = [
    ({'text': 'name,department,salary\nAda Lovelace,Engineering,120000\nGrace Hopper,Engineering,135000\nKatherine Johnson,Research,110000\nDorothy Vaughan,Research,98000\nMary Jackson,Operations,87000\nAnnie Easley,Engineering,99000\n'}, [{'name': 'Ada Lovelace', 'department': 'Engineering', 'salary': 120000}, {'name': 'Grace Hopper', 'department': 'Engineering', 'salary': 135000}, {'name': 'Katherine Johnson', 'department': 'Research', 'salary': 110000}, {'name': 'Dorothy Vaughan', 'department': 'Research', 'salary': 98000}, {'name': 'Mary Jackson', 'department': 'Operations', 'salary': 87000}, {'name': 'Annie Easley', 'department': 'Engineering', 'salary': 99000}]),
]


def parse_csv(text):
    return _replay('parse_csv', _PARSE_CSV_CALLS, {'text': text})


_SUMMARIZE_CALLS = [
    ({'rows': [{'name': 'Ada Lovelace', 'department': 'Engineering', 'salary': 120000}, {'name': 'Grace Hopper', 'department': 'Engineering', 'salary': 135000}, {'name': 'Katherine Johnson', 'department': 'Research', 'salary': 110000}, {'name': 'Dorothy Vaughan', 'department': 'Research', 'salary': 98000}, {'name': 'Mary Jackson', 'department': 'Operations', 'salary': 87000}, {'name': 'Annie Easley', 'department': 'Engineering', 'salary': 99000}]}, [{'department': 'Engineering', 'headcount': 3, 'total_salary': 354000}, {'department': 'Operations', 'headcount': 1, 'total_salary': 87000}, {'department': 'Research', 'headcount': 2, 'total_salary': 208000}]),
]


def summarize(rows):
    return _replay('summarize', _SUMMARIZE_CALLS, {'rows': rows})
