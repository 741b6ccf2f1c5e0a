"""User filters over trajectory tables: `"tool_failures > 3 and turns > 50"` becomes a
`pyarrow.compute.Expression`.

The text is parsed with Python's `ast` and never evaluated. Only this grammar is accepted:

    condition  := condition and condition | condition or condition | not condition | (condition)
                | operand op operand [op operand ...]          (chained comparisons are and-ed)
                | column in (const, ...) | column not in (const, ...)
    op         := == | != | < | <= | > | >=
    operand    := column | const
    column     := a top-level scalar column of `schema.SCHEMA` (string, integer, float, boolean,
                  timestamp), including the partition columns `harness` and `date`
    const      := 'text' | 123 | -1.5 | True | False

Timestamp columns (`started_at`, `ended_at`) compare with ISO text: `started_at >= '2024-05-01'`
(naive times are UTC). Everything else — calls, attributes, arithmetic, list/struct columns,
unknown names — raises `QueryError` naming the offending part and the allowed columns. Rows where
the condition is null (a null column value) are dropped, as `Table.filter` does.

Reading the store and printing belong elsewhere; `parse_filter`'s expression can also be handed to
`pyarrow.dataset.Dataset.to_table(filter=...)` for pushdown.
"""

from __future__ import annotations

import ast
import datetime as dt
import difflib
import operator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from agentrl_cli.runtime.data import schema
from agentrl_cli.core.errors import UsageError

SUMMARY_COLUMNS = ("trajectory_id", "harness", "task_id", "outcome", "reward", "turns", "tool_calls",
                   "tool_failures", "started_at")
_GRAMMAR = ("a filter compares columns with constants using ==, !=, <, <=, >, >=, in, not in, "
            "joined by and/or/not")
_EXAMPLE = "e.g. \"tool_failures > 3 and turns > 50\" or \"outcome in ('timeout', 'error')\""
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}
_PY_KIND = {str: "text", int: "a number", float: "a number", bool: "a boolean"}
_FORBIDDEN = {ast.Call: "function calls are not allowed", ast.Attribute: "attribute access is not allowed",
              ast.Subscript: "indexing is not allowed", ast.BinOp: "arithmetic is not allowed",
              ast.UnaryOp: "arithmetic is not allowed", ast.NamedExpr: "assignment is not allowed",
              ast.Lambda: "lambdas are not allowed", ast.IfExp: "if-expressions are not allowed"}


class QueryError(UsageError, ValueError):
    """A filter that is not in the accepted grammar, names an unknown column or mixes types."""


def _kind(typ: pa.DataType) -> str | None:
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return "string"
    if pa.types.is_boolean(typ):
        return "bool"
    if pa.types.is_integer(typ):
        return "int"
    if pa.types.is_floating(typ):
        return "float"
    if pa.types.is_timestamp(typ):
        return "timestamp"
    return None


COLUMNS: dict[str, str] = {f.name: k for f in schema.SCHEMA if (k := _kind(f.type)) is not None}
"""Filterable column → kind ("string" | "int" | "float" | "bool" | "timestamp")."""


def _allowed() -> str:
    return "allowed columns: " + ", ".join(COLUMNS)


@dataclass
class _Ctx:
    text: str
    used: set[str] = field(default_factory=set)

    def src(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.text, node) or ast.unparse(node)

    def error(self, what: str, node: ast.AST | None = None, allowed: bool = True) -> QueryError:
        where = f": `{self.src(node)}`" if node is not None else ""
        tail = f". {_allowed().capitalize()}" if allowed else ""
        return QueryError(f"filter {self.text!r}: {what}{where}{tail}", hint=f"{_GRAMMAR}; {_EXAMPLE}")


def parse_filter(text: str) -> pc.Expression:
    """The filter `text` as an Arrow expression over `schema.SCHEMA` columns; `QueryError` if it is
    outside the grammar in the module docstring."""
    return _compile(text)[0]


def _compile(text: str) -> tuple[pc.Expression, set[str]]:
    if not isinstance(text, str) or not text.strip():
        raise QueryError(f"the filter is empty ({text!r})", hint=f"{_GRAMMAR}; {_EXAMPLE}")
    ctx = _Ctx(text.strip())
    try:
        tree = ast.parse(ctx.text, mode="eval")
    except SyntaxError as exc:
        raise ctx.error(f"cannot parse the filter ({exc.msg}, column {exc.offset})", allowed=False) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ctx.error(f"cannot parse the filter ({type(exc).__name__})", allowed=False) from None
    try:
        return _condition(tree.body, ctx), ctx.used
    except RecursionError:
        raise ctx.error("the filter is nested too deeply", allowed=False) from None


def _condition(node: ast.AST, ctx: _Ctx) -> pc.Expression:
    if isinstance(node, ast.BoolOp):
        parts = [_condition(v, ctx) for v in node.values]
        combine = operator.and_ if isinstance(node.op, ast.And) else operator.or_
        out = parts[0]
        for part in parts[1:]:
            out = combine(out, part)
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return ~_condition(node.operand, ctx)
    if isinstance(node, ast.Compare):
        return _comparison(node, ctx)
    if isinstance(node, ast.Name):
        if _column(node, ctx) == "bool":
            return pc.field(node.id)
        raise ctx.error(f"a column alone is not a condition; compare it, e.g. `{node.id} > 0` or "
                        f"`{node.id} == '...'`", node)
    if isinstance(node, ast.Constant):
        raise ctx.error("a constant alone is not a condition; compare a column with it", node)
    raise _forbidden(node, ctx)


def _forbidden(node: ast.AST, ctx: _Ctx) -> QueryError:
    what = _FORBIDDEN.get(type(node), f"{type(node).__name__} expressions are not allowed")
    return ctx.error(what, node)


def _column(node: ast.Name, ctx: _Ctx) -> str:
    """The kind of the column `node` names, or a QueryError saying why it cannot be filtered on."""
    name = node.id
    if name in COLUMNS:
        ctx.used.add(name)
        return COLUMNS[name]
    if name in schema.SCHEMA.names:
        typ = schema.SCHEMA.field(name).type
        nested = "list" if pa.types.is_list(typ) else "map" if pa.types.is_map(typ) else "nested"
        raise ctx.error(f"column {name!r} is a {nested} column; only scalar columns can be filtered on")
    if name.lower() in ("true", "false"):
        hint = f" (did you mean {name.capitalize()}?)"
    else:
        close = difflib.get_close_matches(name, list(COLUMNS), n=1, cutoff=0.6)
        close = close or [c for c in COLUMNS if c.lower() == name.lower()]
        hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ctx.error(f"unknown column {name!r}{hint}")


def _operand(node: ast.AST, ctx: _Ctx) -> tuple[str, Any]:
    """("column", name) or ("const", python value)."""
    if isinstance(node, ast.Name):
        _column(node, ctx)
        return "column", node.id
    value = _constant(node, ctx)
    return "const", value


def _constant(node: ast.AST, ctx: _Ctx) -> Any:
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float)):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, ast.Constant):
        if type(node.value) in (str, int, float, bool):
            return node.value
        raise ctx.error("only text, numbers and True/False are allowed as constants", node)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        raise ctx.error("a list of values is only allowed after `in` / `not in`", node)
    raise _forbidden(node, ctx)


def _comparison(node: ast.Compare, ctx: _Ctx) -> pc.Expression:
    lefts = [node.left, *node.comparators[:-1]]
    out = None
    for left, op, right in zip(lefts, node.ops, node.comparators):
        if isinstance(op, (ast.In, ast.NotIn)):
            expr = _membership(node, left, right, ctx)
            expr = ~expr if isinstance(op, ast.NotIn) else expr
        elif isinstance(op, (ast.Is, ast.IsNot)):
            raise ctx.error("`is` / `is not` are not allowed; use == or !=", node)
        else:
            expr = _compare(node, op, _operand(left, ctx), _operand(right, ctx), ctx)
        out = expr if out is None else out & expr
    return out


def _compare(node: ast.Compare, op: ast.cmpop, left: tuple[str, Any], right: tuple[str, Any],
             ctx: _Ctx) -> pc.Expression:
    if left[0] == right[0] == "const":
        raise ctx.error("a comparison needs a column on at least one side", node)
    if left[0] == right[0] == "column":
        kinds = {COLUMNS[left[1]], COLUMNS[right[1]]}
        if len(kinds) > 1 and kinds != {"int", "float"}:
            raise ctx.error(f"type mismatch: {left[1]} ({schema.SCHEMA.field(left[1]).type}) cannot be "
                            f"compared with {right[1]} ({schema.SCHEMA.field(right[1]).type})", node)
        return _COMPARE[type(op)](pc.field(left[1]), pc.field(right[1]))
    column = left[1] if left[0] == "column" else right[1]
    value = _scalar(column, right[1] if left[0] == "column" else left[1], node, ctx)
    lhs, rhs = (pc.field(column), value) if left[0] == "column" else (value, pc.field(column))
    return _COMPARE[type(op)](lhs, rhs)


def _membership(node: ast.Compare, left: ast.AST, right: ast.AST, ctx: _Ctx) -> pc.Expression:
    if not isinstance(left, ast.Name):
        raise ctx.error("`in` needs a column on its left, e.g. outcome in ('timeout', 'error')", node)
    kind = _column(left, ctx)
    if not isinstance(right, (ast.Tuple, ast.List, ast.Set)):
        raise ctx.error("`in` needs a parenthesised list of constants on its right, "
                        "e.g. outcome in ('timeout', 'error')", node)
    values = [_convert(left.id, _constant(elt, ctx), node, ctx) for elt in right.elts]
    if kind == "int" or kind == "float":
        typ = pa.float64() if any(isinstance(v, float) for v in values) else pa.int64()
    else:
        typ = schema.SCHEMA.field(left.id).type
    return pc.field(left.id).isin(pa.array(values, type=typ))


def _convert(column: str, value: Any, node: ast.AST, ctx: _Ctx) -> Any:
    """`value` as a Python value of `column`'s kind, or a QueryError naming the mismatch."""
    kind = COLUMNS[column]
    ok = {"string": isinstance(value, str), "bool": isinstance(value, bool),
          "int": isinstance(value, (int, float)) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "timestamp": isinstance(value, str)}[kind]
    if not ok:
        raise ctx.error(f"type mismatch: {column} is {schema.SCHEMA.field(column).type} and {value!r} is "
                        f"{_PY_KIND[type(value)]}", node, allowed=False)
    if kind == "timestamp":
        try:
            when = dt.datetime.fromisoformat(value)
        except ValueError:
            raise ctx.error(f"{value!r} is not a date/time for {column}; write e.g. '2024-05-01' or "
                            "'2024-05-01T12:00:00Z'", node, allowed=False) from None
        return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)
    if isinstance(value, int) and not -(1 << 63) <= value < (1 << 63):
        raise ctx.error(f"{value} is out of range for {column}", node, allowed=False)
    return value


def _scalar(column: str, value: Any, node: ast.AST, ctx: _Ctx) -> pc.Expression:
    value = _convert(column, value, node, ctx)
    if COLUMNS[column] == "timestamp":
        return pc.scalar(pa.scalar(value, type=pa.timestamp("us", tz="UTC")))
    return pc.scalar(value)


def filter_table(table: pa.Table, text: str) -> pa.Table:
    """The rows of `table` for which the filter `text` holds."""
    expr, used = _compile(text)
    missing = sorted(used - set(table.column_names))
    if missing:
        raise QueryError(f"filter {text!r} uses {', '.join(missing)}, which this table does not have "
                         f"(its columns: {', '.join(table.column_names)})",
                         hint="read the table with its partition columns, or filter on another column")
    try:
        return table.filter(expr)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise QueryError(f"filter {text!r} cannot be applied to this table: {exc}",
                         hint="check the column types with `schema.SCHEMA`") from None


def summary_rows(table: pa.Table, columns: tuple[str, ...] = SUMMARY_COLUMNS,
                 limit: int | None = None) -> list[dict]:
    """A compact projection of `table` for printing: one dict per row with `columns` in order
    (None where the table lacks a schema column); timestamps as ISO 8601 text."""
    unknown = [c for c in columns if c not in schema.SCHEMA.names]
    if unknown:
        close = difflib.get_close_matches(unknown[0], schema.SCHEMA.names, n=1)
        mean = f" (did you mean {close[0]!r}?)" if close else ""
        raise QueryError(f"unknown column {unknown[0]!r}{mean}", hint=_allowed())
    if limit is not None:
        table = table.slice(0, max(limit, 0))
    present = [c for c in columns if c in table.column_names]
    rows = table.select(present).to_pylist()
    return [{c: _printable(row.get(c)) for c in columns} for row in rows]


def _printable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="seconds")
    return value
