"""Reading a routine package folder: :func:`load_routine` and :func:`validate_routine`.

The YAML is loaded safely, em-core's own package format (``input_schema``,
``check:``, a ``prompt:`` mapping, ``udf.py``, ``schemas/``) is converted on load
by :mod:`.emcore` (the loaded :class:`~.model.Routine` lists the conversions),
``udfs.py`` is parsed with :mod:`ast` and never run, and the data is checked by
:mod:`.validator`. :func:`load_routine` returns a :class:`~.model.Routine`
(cached by path and mtimes) or raises :class:`~engrain.RoutineError` listing the
problems; :func:`validate_routine` returns them.
"""

from __future__ import annotations

import ast
import os
import pathlib
import stat
import threading
from typing import Any

from .._disk_cache import cache_dir, digest, read_verified, write_verified
from .._errors import JSONTooDeepError, RoutineError
from .._events import MAX_DEPTH, check_depth
from .model import ROUTINE_FILE, UDFS_FILE, Package, Routine, RoutineIssue, Step, UdfInfo
from .validator import check_routine_data
from .yamlfile import load_yaml_text, read_yaml_text


def _safe_file(root: pathlib.Path, name: str) -> pathlib.Path:
    """``root/name``, refusing a file whose real path (symlinks resolved) leaves ``root``."""
    p = root / name
    real = p.resolve()
    if real.parent != root.resolve():
        raise RoutineError(str(root), [RoutineIssue(name, None, "file", f"resolves outside the routine folder: {real}")])
    return p


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_regular(mode: int) -> str | None:
    """Why a file of ``mode`` is not read as a package file (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    kind = next((what for test, what in _KINDS if test(mode)), "not a regular file")
    return f"is {kind}, not a regular file"


#: Largest UDF file a routine may hold. It is parsed on the host (``ast``) even when its functions run in the
#: sandbox, and parsing costs time and memory in proportion: 6 MB of short lines took 15 s and 2.4 GB.
MAX_UDF_BYTES = 1024 * 1024


def _read_regular(path: pathlib.Path, name: str, limit: int = MAX_UDF_BYTES) -> bytes | None:
    """The bytes of the regular file ``path`` (None: no such file); a :class:`RoutineError` naming ``name`` otherwise.

    Reading a named pipe blocks until something writes to it, and a folder or device is no
    file to read: the kind is checked before opening (stat, so a symlink inside the folder is
    followed), the file opened without blocking, and the kind checked again on what was opened
    (the name may have been swapped in between).
    """
    try:
        why = _not_regular(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if why is None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            why = _not_regular(os.fstat(fd).st_mode)
            if why is None:
                data = f.read(limit + 1)  # bounded: a file that grows after the stat is still refused
                if len(data) <= limit:
                    return data
                why = f"larger than the {limit:,} bytes a UDF file may hold"
    raise RoutineError(str(path), [RoutineIssue(name, None, "file", why)])


def parse_udfs(source: str) -> dict[str, UdfInfo]:
    """Top-level functions of ``udfs.py`` source, found with :mod:`ast` (never executed)."""
    out: dict[str, UdfInfo] = {}
    for node in ast.parse(source, UDFS_FILE).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            a = node.args
            pos = [p.arg for p in a.posonlyargs + a.args]
            kwonly = [p.arg for p in a.kwonlyargs]
            n_default = len(a.defaults)
            required = pos[: len(pos) - n_default] + [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
            out[node.name] = UdfInfo(node.name, pos + kwonly, required, a.kwarg is not None, a.vararg is not None, node.lineno)
    return out


_MISS = object()


def _yaml_cache_file(text: str) -> pathlib.Path | None:
    # -2: parses cached before duplicate keys and values JSON cannot hold were refused must not be reused
    folder = cache_dir("routines-2")
    return None if folder is None else folder / f"{digest(text.encode('utf-8'))}.json"


def _cached_yaml(text: str) -> Any:
    """The data of this exact routine.yaml text, parsed before (``_MISS`` if not cached).

    Importing PyYAML costs more than running a small routine, so the CLI, a new
    process each time, keeps parsed routine.yaml data as JSON in engrain's cache
    directory, named by the text's SHA-256 (see :mod:`engrain._disk_cache` for
    what makes an entry usable). The data is then checked as if just parsed.
    """
    path = _yaml_cache_file(text)
    payload = read_verified(path) if path is not None else None
    if payload is None:
        return _MISS
    import json

    try:
        return json.loads(payload)
    except (ValueError, RecursionError):
        return _MISS


def _cache_yaml(text: str, data: Any) -> None:
    """Keep ``data`` for :func:`_cached_yaml` when JSON holds it exactly (str keys, no dates, no NaN)."""
    import json

    try:
        payload = json.dumps(data, allow_nan=False, separators=(",", ":"))
        if json.loads(payload) != data:
            return
    except (TypeError, ValueError, RecursionError):
        return
    path = _yaml_cache_file(text)
    if path is not None:
        write_verified(path, payload.encode("utf-8"))


def _read(root: pathlib.Path) -> tuple[Any, str | None, list[RoutineIssue], Package]:
    """routine.yaml data (em-core's format converted) and the UDF source; issues for unreadable files."""
    from . import emcore

    pkg = Package()
    if not root.is_dir():
        why = "not a routine folder (no such folder)" if not root.exists() else "not a routine folder (not a folder)"
        raise RoutineError(str(root), [RoutineIssue(str(root), None, "path", why)])
    path = _safe_file(root, ROUTINE_FILE)
    try:
        why = _not_regular(os.stat(path).st_mode)  # a named pipe would block the read below
    except (FileNotFoundError, NotADirectoryError):
        why = None
    if why is not None:
        return None, None, [RoutineIssue(ROUTINE_FILE, None, "file", why)], pkg
    try:
        text = read_yaml_text(path, ROUTINE_FILE)
        data = _cached_yaml(text)
        if data is _MISS:
            data = load_yaml_text(text, ROUTINE_FILE)
            _cache_yaml(text, data)
    except FileNotFoundError:
        return None, None, [RoutineIssue(ROUTINE_FILE, None, "file", "missing")], pkg
    except RoutineError as e:
        return None, None, list(e.issues), pkg
    if data is None:
        return None, None, [RoutineIssue(ROUTINE_FILE, None, "file", "empty: a routine file is a mapping with name, inputs and steps")], pkg
    try:
        check_depth(data, ROUTINE_FILE, "routine", MAX_DEPTH)
    except JSONTooDeepError as e:
        return None, None, [RoutineIssue(ROUTINE_FILE, None, e.path.removeprefix("routine."), f"nested deeper than {MAX_DEPTH} levels")], pkg
    issues: list[RoutineIssue] = []
    has_udfs, has_udf = (root / UDFS_FILE).exists(), (root / emcore.UDF_FILE).exists()
    if has_udfs and has_udf:
        issues.append(RoutineIssue(emcore.UDF_FILE, None, "file", f"both {UDFS_FILE} and {emcore.UDF_FILE} exist: keep one"))
    elif has_udf:
        pkg.udf_file = emcore.UDF_FILE
    if emcore.is_emcore(data, root):
        data, pkg.conversions, problems = emcore.convert(data, root)
        pkg.dialect = "em-core"
        pkg.bare = emcore.input_names(data)
        pkg.open_inputs = not pkg.bare and not (data.get("inputs") or {}).get("properties")
        issues += [RoutineIssue(f, None, "file", m) for f, m in problems]
    udfs = _safe_file(root, pkg.udf_file)
    source = None
    try:
        raw = _read_regular(udfs, pkg.udf_file)
    except RoutineError as e:
        return None, None, issues + list(e.issues), pkg
    if raw is not None:
        try:
            source = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw.count(b"\n", 0, e.start) + 1
            return None, None, [RoutineIssue(pkg.udf_file, None, f"line {line}", f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})")], pkg
    return data, source, issues, pkg


def _analyse(
    root: pathlib.Path, tools: Any
) -> tuple[Any, dict[str, UdfInfo] | None, list[RoutineIssue], list[Step], Package]:
    data, source, issues, pkg = _read(root)
    if data is None:
        return data, None, issues, [], pkg
    udfs: dict[str, UdfInfo] | None = None
    problem = None
    if source is not None:
        try:
            udfs = parse_udfs(source)
        except SyntaxError as e:
            issues.append(RoutineIssue(pkg.udf_file, None, f"line {e.lineno}", f"syntax error: {e.msg}"))
            problem = f"{pkg.udf_file} has a syntax error"
        except (ValueError, RecursionError, MemoryError) as e:  # null bytes; nesting too deep for the parser
            issues.append(RoutineIssue(pkg.udf_file, None, "file", f"cannot be parsed: {type(e).__name__}: {e}"))
            problem = f"{pkg.udf_file} cannot be parsed"
    else:
        udfs = {}
        problem = None
    found, steps = check_routine_data(data, tools, udfs, problem, pkg)
    if source is None:
        found = [
            RoutineIssue(i.file, i.step, i.field, i.message.replace(f"{UDFS_FILE} defines no function", f"{UDFS_FILE} is missing; no function"))
            for i in found
        ]
    return data, udfs, issues + found, steps, pkg


def validate_routine(path: str | os.PathLike[str], tools: Any = None) -> list[RoutineIssue]:
    """Every problem of the routine package at ``path`` (empty when valid).

    With ``tools`` (a :class:`~engrain.ToolRegistry`), tool names must be registered.
    ``udfs.py`` is parsed, never imported or executed.
    """
    root = pathlib.Path(path)
    try:
        return _analyse(root, tools)[2]
    except RoutineError as e:
        return list(e.issues)


_cache: dict[str, tuple[tuple[tuple[int, ...] | None, ...], Routine]] = {}
_cache_lock = threading.Lock()

#: Every file of a package the loader reads: the cache key stats them, and a run records their digests.
PACKAGE_FILES = (ROUTINE_FILE, UDFS_FILE, "udf.py", "schemas/input.schema.json", "schemas/output.schema.json")


def _mtimes(root: pathlib.Path) -> tuple[tuple[int, ...] | None, ...]:
    """The cache key of the package at ``root``: exact integers per file (``None``: missing).

    Integers, not a sum in a float, which cannot tell sizes apart at today's
    nanosecond mtimes. The ctime is there because ``cp -p``, ``rsync -t`` and
    ``touch -r`` put an old mtime back, but any write moves the ctime; the inode
    tells a file renamed over the old one (an atomic save) from the old one.
    """
    out: list[tuple[int, ...] | None] = []
    for name in PACKAGE_FILES:
        try:
            st = os.stat(root / name)
            out.append((st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev))
        except (FileNotFoundError, NotADirectoryError):
            out.append(None)
    return tuple(out)


def load_routine(path: str | os.PathLike[str]) -> Routine:
    """The routine package at ``path``; :class:`~engrain.RoutineError` listing every problem.

    Parsed packages are cached by absolute path and the mtimes of their files.
    """
    root = pathlib.Path(path).absolute()
    key = str(root)
    stamp = _mtimes(root)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    data, udfs, issues, steps, pkg = _analyse(root, None)
    if issues:
        raise RoutineError(key, issues)
    from . import template as _template

    for st in steps:
        value = st.spec.get("args", {}) if st.type in ("tool.call", "udf.call") else st.spec.get("value")
        if st.type in ("tool.call", "udf.call", "return"):
            # Escaped literals name no variable but still render to other text.
            st.dynamic = _template.needs_render(value)
    r = Routine(
        path=root,
        name=data["name"],
        description=str(data.get("description", "")),
        version=str(data.get("version", "")),
        trusted=bool(data.get("trusted", False)),
        inputs=data["inputs"],
        output=data.get("output"),
        tools={k: (v or {}) for k, v in (data.get("tools") or {}).items()},
        steps=steps,
        udfs=udfs or {},
        raw=data,
        dialect=pkg.dialect,
        conversions=pkg.conversions,
        bare_inputs=pkg.dialect == "em-core",
        udf_file=pkg.udf_file,
    )
    with _cache_lock:
        _cache[key] = (stamp, r)
    return r
