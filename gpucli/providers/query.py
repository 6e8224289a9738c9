"""vast.ai's offer query language, parsed exactly as the ``vastai`` CLI parses it.

One text such as ``"gpu_name=RTX_3090 num_gpus>=4 reliability>0.95 inet_down>200"`` drives three
things: the vast.ai search request body (server-side filtering), client-side filtering of RunPod
offers, and filtering of the local catalogue. Users already know this language from ``vastai search
offers``, so gpucli reproduces it byte for byte in the request body rather than inventing its own.

The grammar (``query = comparison comparison ...``, ``comparison = field op value``), operator words,
``in [...]`` lists, ``_`` for space, literals, unit multipliers, ``field=any`` and the default filters
follow the reference notes (providers.md §2.3). Numbers stay strings in the body, exactly as the
vastai CLI sends them; only ``matches()`` coerces them when comparing.

Where gpucli deliberately differs from ``vastai``: an unknown field is an error naming the closest
valid fields (vastai only prints a warning and sends the filter anyway), and every parse problem is
a :class:`QueryError` (a ``UsageError``) rather than a ``ValueError`` or a crash.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from gpucli.errors import UsageError

__all__ = [
    "ALIASES",
    "DEFAULT_FILTERS",
    "MULTIPLIERS",
    "OFFER_FIELDS",
    "Query",
    "QueryError",
    "comparisons",
    "parse_order",
    "parse_query",
]

#: The fields vast.ai's search understands (vastai ``offers_fields``).
OFFER_FIELDS: frozenset[str] = frozenset(
    """bw_nvlink compute_cap cpu_arch cpu_cores cpu_cores_effective cpu_ghz cpu_ram cuda_max_good
    datacenter direct_port_count driver_version disk_bw disk_space dlperf dlperf_per_dphtotal dph_total
    duration external flops_per_dphtotal gpu_arch gpu_display_active gpu_frac gpu_mem_bw gpu_name
    gpu_ram gpu_total_ram gpu_max_power gpu_max_temp has_avx host_id id inet_down inet_down_cost
    inet_up inet_up_cost machine_id min_bid mobo_name num_gpus pci_gen pcie_bw reliability rentable
    rented storage_cost static_ip total_flops ubuntu_version verification verified vms_enabled
    geolocation cluster_id""".split()
)

#: Short names users type, mapped to the field the server knows (vastai ``offers_alias``).
#: ``reliability -> reliability2`` is commented out upstream, so ``reliability`` is sent as-is.
ALIASES: Mapping[str, str] = {
    "cuda_vers": "cuda_max_good",
    "display_active": "gpu_display_active",
    "dlperf_usd": "dlperf_per_dphtotal",
    "dph": "dph_total",
    "flops_usd": "flops_per_dphtotal",
}

#: User units -> API units: GB -> MB for RAM fields, days -> seconds for duration.
MULTIPLIERS: Mapping[str, float] = {
    "cpu_ram": 1000,
    "gpu_ram": 1000,
    "gpu_total_ram": 1000,
    "duration": 24.0 * 60.0 * 60.0,
}

#: Filters the packaged vastai CLI adds unless ``-n/--no-default`` is given (no ``rented``).
DEFAULT_FILTERS: tuple[tuple[str, str, bool], ...] = (
    ("verified", "eq", True),
    ("external", "eq", False),
    ("rentable", "eq", True),
)

SEARCH_TYPES: Mapping[str, str] = {
    "on-demand": "on-demand",
    "bid": "bid",
    "interruptible": "bid",
    "reserved": "reserved",
}

DEFAULT_ORDER = "score-"
DEFAULT_ALLOCATED_STORAGE_GB = 5.0

# The tokeniser of the vastai CLI (providers.md §2.3), unchanged: field, operator, spaces, value, spaces.
_TOKEN = re.compile(
    r"([a-zA-Z0-9_]+)( *[=><!]+| +(?:[lg]te?|nin|neq|eq|not ?eq|not ?in|in) )?( *)"
    r"(\[[^\]]+\]|\"[^\"]+\"|[^ ]+)?( *)"
)

_OPS: Mapping[str, str] = {
    ">=": "gte", ">": "gt", "gt": "gt", "gte": "gte",
    "<=": "lte", "<": "lt", "lt": "lt", "lte": "lte",
    "!=": "neq", "==": "eq", "=": "eq", "eq": "eq",
    "neq": "neq", "noteq": "neq", "not eq": "neq",
    "notin": "notin", "not in": "notin", "nin": "notin", "in": "in",
}

_LITERALS: Mapping[str, Any] = {"true": True, "True": True, "false": False, "False": False,
                                "None": None, "null": None}
_WILDCARDS = ("?", "*", "any")

#: Fields whose values are words; vast compares them as strings (vastai ``offers_fields`` types).
TEXT_FIELDS: frozenset[str] = frozenset(
    "cpu_arch datacenter geolocation gpu_arch gpu_name mobo_name ubuntu_version verification".split())
#: Yes/no fields: true, false (or 1, 0).
BOOL_FIELDS: frozenset[str] = frozenset(
    "external gpu_display_active has_avx rentable rented static_ip verified vms_enabled".split())
_BOOL_WORDS = {"true": True, "True": True, "1": True, "false": False, "False": False, "0": False}
_ORDER_FIELD = re.compile(r"^[A-Za-z0-9_]+$")

Value = str | bool | float | int | None | tuple[str, ...]


class QueryError(UsageError):
    """The query text cannot be parsed; the message says what to change."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint or "see `vastai search offers --help` for the query syntax")


class UnknownQueryField(QueryError):
    """A field that vast.ai's search does not know; the hint names the closest valid ones."""

    def __init__(self, name: str) -> None:
        valid = sorted(OFFER_FIELDS | set(ALIASES))
        close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
        hint = ("did you mean " + ", ".join(close) + "?") if close else (
            "valid fields: " + ", ".join(valid))
        super().__init__(f"unknown query field '{name}'", hint=hint)
        self.name = name


@dataclass(frozen=True)
class Query:
    """A parsed query: an ordered tuple of ``(field, ((op, value), ...))``.

    Ordered and immutable so that equal texts give equal, hashable queries and the request body keeps
    the key order the vastai CLI produces (defaults first, then fields in the order typed).
    """

    filters: tuple[tuple[str, tuple[tuple[str, Value], ...]], ...] = ()

    # -- views -------------------------------------------------------------------------------------
    def as_dict(self) -> dict[str, dict[str, Any]]:
        """The filters as the JSON-ready ``{field: {op: value}}`` the vast.ai API expects."""
        return {field: {op: (list(v) if isinstance(v, tuple) else v) for op, v in ops}
                for field, ops in self.filters}

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(f for f, _ in self.filters)

    def without(self, *fields: str) -> Query:
        """The same query minus some fields (e.g. vast-only fields before filtering RunPod offers)."""
        return Query(tuple((f, ops) for f, ops in self.filters if f not in fields))

    def to_vast_body(self, *, order: str | None = DEFAULT_ORDER, type: str = "on-demand",
                     limit: int | None = None,
                     allocated_storage: float = DEFAULT_ALLOCATED_STORAGE_GB) -> dict[str, Any]:
        """The ``POST /api/v0/bundles/`` body the vastai CLI would send for this query.

        Keys come in the CLI's order: filters, ``order``, ``type``, ``limit`` (only when given),
        ``allocated_storage``. ``type`` accepts ``interruptible`` as a synonym of ``bid``.
        """
        if type not in SEARCH_TYPES:
            raise QueryError(f"unknown offer type '{type}'", hint="use on-demand, bid or reserved")
        body: dict[str, Any] = self.as_dict()
        body["order"] = [list(pair) for pair in parse_order(order or "")]
        body["type"] = SEARCH_TYPES[type]
        if limit:
            if limit < 0:
                raise QueryError(f"limit must be positive, got {limit}")
            body["limit"] = int(limit)
        body["allocated_storage"] = allocated_storage
        return body

    # -- client-side filtering ---------------------------------------------------------------------
    def matches(self, record: Mapping[str, Any], *, missing_ok: bool = True) -> bool:
        """Whether ``record`` (field names in vast.ai's vocabulary and units) passes every filter.

        ``missing_ok`` decides what a filter on a field the record does not carry means: with True
        (the default) the filter is skipped, because a RunPod offer or a catalogue row simply has no
        ``verified`` or ``external``; with False such a record fails. A field that is present with the
        value None fails every comparison except ``eq None``.
        """
        for field, ops in self.filters:
            if field not in record:
                if missing_ok:
                    continue
                return False
            actual = record[field]
            for op, expected in ops:
                if not _compare(field, actual, op, expected):
                    return False
        return True

    def __str__(self) -> str:
        parts = []
        for field, ops in self.filters:
            for op, value in ops:
                parts.append(f"{field} {op} {value!r}")
        return " ".join(parts)


def comparisons(text: str) -> list[tuple[str, str]]:
    """Each comparison of a valid query ``text`` as ``(field as the server knows it, its words as
    typed)``, in order: what lets one query replace another's filter of a field (launch filters)."""
    parse_query(text, defaults=False)  # a bad query is said here, as parse_query says it
    return [(ALIASES.get(t[0], t[0]), "".join(t).strip()) for t in _TOKEN.findall(text.strip()) if t[0]]


def parse_query(text: str | None, *, defaults: bool = True) -> Query:
    """Parse vast.ai query text into a :class:`Query`.

    ``defaults`` adds the packaged vastai CLI's default filters (``verified``, ``external``,
    ``rentable``) before the text is applied, so ``verified=any`` removes one of them, as in vastai.
    Raises :class:`QueryError` (a ``UsageError``) and nothing else for any input.
    """
    res: dict[str, dict[str, Value]] = {}
    if defaults:
        for field, op, default in DEFAULT_FILTERS:
            res[field] = {op: default}
    if text is None:
        return _freeze(res)
    if not isinstance(text, str):
        raise QueryError(f"query must be text, got {type(text).__name__}")
    text = text.strip()
    tokens = _TOKEN.findall(text)
    joined = "".join("".join(t) for t in tokens)
    if joined != text:
        rest = text[len(_common_prefix(joined, text)):]
        raise QueryError(f"unconsumed text in query near {rest[:40]!r}",
                         hint="did you forget to quote your query? write spaces in values as _")

    for name, raw_op, _sp1, raw_value, _sp2 in tokens:
        field = ALIASES.get(name, name)
        op = raw_op.strip()
        op_name = _OPS.get(op)
        if not op_name:
            shown = f"'{op}'" if op else "none"
            raise QueryError(f"unknown operator {shown} after '{name}'",
                             hint="did you forget to quote your query? use one of = != < <= > >= in notin; "
                                  "write spaces in values as _ (RTX_3090)")
        if field not in OFFER_FIELDS:
            raise UnknownQueryField(name)
        if raw_value.lstrip().startswith("[") != raw_value.rstrip().rstrip(",").endswith("]"):
            raise QueryError(f"unbalanced brackets in '{name} {op} {raw_value.strip()}'",
                             hint="write a list as [1,2,4]")
        text_value = raw_value.strip(",[]")
        value: Value = text_value
        if field == "driver_version" and "." in text_value:
            value = _numeric_version(text_value)
        if op_name in ("in", "notin"):
            assert isinstance(value, str)
            value = tuple(x.strip() for x in value.split(",") if x.strip())
        if value == "" or value == ():
            raise QueryError(f"missing value for '{name}'",
                             hint="did you forget to quote your query?")
        if isinstance(value, str) and value in _WILDCARDS:
            if op_name != "eq":
                raise QueryError(f"'{name}{op}{value}': a wildcard only makes sense with =")
            res.pop(field, None)
            continue
        if isinstance(value, str):
            value = value.replace("_", " ").strip('"')
        elif isinstance(value, tuple):
            value = tuple(x.replace("_", " ").strip('"') for x in value)

        _check_type(name, field, value)
        entry = res.setdefault(field, {})
        if field in MULTIPLIERS:
            entry[op_name] = _scaled(name, value, MULTIPLIERS[field])
        elif isinstance(value, str) and value in _LITERALS:
            entry[op_name] = _LITERALS[value]
        elif field in BOOL_FIELDS and isinstance(value, str):
            entry[op_name] = _BOOL_WORDS[value]
        else:
            entry[op_name] = value
    return _freeze(res)


def parse_order(text: str) -> tuple[tuple[str, str], ...]:
    """Parse ``--order`` text: comma-separated fields, ``-`` suffix for descending, ``+`` ascending.

    As in vastai, no suffix means ascending (so ``dlperf_usd`` puts the *worst* value first) and
    aliases apply (``dlperf_usd-`` -> ``dlperf_per_dphtotal desc``).
    """
    out: list[tuple[str, str]] = []
    for item in text.split(","):
        name = item.strip()
        if not name:
            continue
        direction, field = "asc", name
        if name.endswith(("--", "++", "-+", "+-")):
            raise QueryError(f"bad sort field '{name}': one '-' (descending) or '+' (ascending) at most",
                             hint="write e.g. --order dph_total or dlperf_usd-")
        if name.strip("-") != name:
            direction, field = "desc", name.strip("-")
        if name.strip("+") != name:
            direction, field = "asc", name.strip("+")
        if not _ORDER_FIELD.match(field):
            raise QueryError(f"bad sort field '{name}'", hint="write e.g. --order dph_total or dlperf_usd-")
        out.append((ALIASES.get(field, field), direction))
    return tuple(out)


# ---------------------------------------------------------------------------------------------------
def _freeze(res: Mapping[str, Mapping[str, Value]]) -> Query:
    return Query(tuple((f, tuple(ops.items())) for f, ops in res.items()))


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _numeric_version(value: str) -> int:
    """``535.86.05`` -> ``535086005``: each part zero-padded to three digits, as vastai does."""
    parts = value.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise QueryError(f"driver_version '{value}' is not a version like 535.86.05")
    return int("".join(p.zfill(3) for p in parts))


def _check_type(name: str, field: str, value: Value) -> None:
    """A number where the field is numeric, true/false where it is yes/no: vast would otherwise compare
    'abc' with numbers and answer nothing (or everything), and the user would never know why."""
    if field in TEXT_FIELDS or field == "driver_version":
        return
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        if not isinstance(item, str) or item in ("None", "null"):  # vast's "field is unset"
            continue
        if field in BOOL_FIELDS:
            if item not in _BOOL_WORDS:
                raise QueryError(f"'{name}' is true or false, got '{item}'")
            continue
        try:
            number = float(item)
        except ValueError:
            raise QueryError(f"'{name}' needs a number, got '{item}'") from None
        if not math.isfinite(number):
            raise QueryError(f"'{name}' needs a finite number, got '{item}'")


def _scaled(name: str, value: Value, factor: float) -> float:
    if not isinstance(value, str):
        raise QueryError(f"'{name}' takes one number, not a list")
    try:
        number = float(value)
    except ValueError:
        raise QueryError(f"'{name}' needs a number, got '{value}'") from None
    if not math.isfinite(number):
        raise QueryError(f"'{name}' needs a finite number, got '{value}'")
    return number * factor


def as_number(value: Any) -> float | None:
    """A provider's number (a JSON number or a numeric string) as a finite float; None for anything
    else, NaN and inf included: a price or a spec never becomes a silent wrong number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def _same(field: str, actual: Any, expected: Any) -> bool:
    """Equality as vast's server applies it: numbers numerically, strings case-insensitively.

    ``geolocation`` is filtered with country codes but records hold ``"City, CC"``, so the last
    comma-separated part is also compared.
    """
    if isinstance(expected, bool) or expected is None or isinstance(actual, bool) or actual is None:
        return actual == expected
    a_num, e_num = as_number(actual), as_number(expected)
    if a_num is not None and e_num is not None:
        return a_num == e_num
    a_text, e_text = str(actual).strip().lower(), str(expected).strip().lower()
    if a_text == e_text:
        return True
    if field == "geolocation" and "," in a_text:
        return a_text.rsplit(",", 1)[1].strip() == e_text
    return False


def version_key(value: Any) -> tuple[int, ...] | None:
    """A dotted version as its numeric components (``"12.10"`` -> (12, 10)); None if not one."""
    parts = str(value).strip().split(".")
    if isinstance(value, bool) or not all(p.isdigit() for p in parts):
        return None
    key = [int(p) for p in parts]
    while len(key) > 1 and key[-1] == 0:  # 12.4 == 12.4.0
        key.pop()
    return tuple(key)


def _compare(field: str, actual: Any, op: str, expected: Any) -> bool:
    if op == "eq":
        return _same(field, actual, expected)
    if op == "neq":
        return not _same(field, actual, expected)
    if op in ("in", "notin"):
        items = expected if isinstance(expected, tuple) else (expected,)
        found = any(_same(field, actual, item) for item in items)
        return found if op == "in" else not found
    if field == "cuda_max_good" and isinstance(actual, str):
        # A version string ("12.10") is compared per component, never as a float (openapi listGpuTypes:
        # "compared numerically per component"): 12.10 > 12.4.
        a_ver, e_ver = version_key(actual), version_key(expected)
        if a_ver is None or e_ver is None:
            return False
        return {"gt": a_ver > e_ver, "gte": a_ver >= e_ver, "lt": a_ver < e_ver}.get(op, a_ver <= e_ver)
    a_num, e_num = as_number(actual), as_number(expected)
    if a_num is None or e_num is None:
        return False
    if op == "gt":
        return a_num > e_num
    if op == "gte":
        return a_num >= e_num
    if op == "lt":
        return a_num < e_num
    return a_num <= e_num  # lte


class _Recorded(Protocol):
    def query_record(self) -> Mapping[str, Any]: ...


_R = TypeVar("_R", bound=_Recorded)


def sort_by_order(items: Sequence[_R], order: str) -> list[_R]:
    """Sort offers by vastai ``--order`` text over their query records: stable, one pass per key from
    the last; offers without a (finite) value for a key go after those with one."""
    result = list(items)
    for field, direction in reversed(parse_order(order or "")):
        def key(item: _R, f: str = field) -> float:
            return as_number(item.query_record().get(f)) or 0.0

        present = [o for o in result if as_number(o.query_record().get(field)) is not None]
        missing = [o for o in result if as_number(o.query_record().get(field)) is None]
        present.sort(key=key, reverse=direction == "desc")
        result = present + missing
    return result
