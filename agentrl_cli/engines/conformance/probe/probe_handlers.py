"""What an engine's route handler takes, for the conformance probe: its whole-body model, its
embedded body keys (`Body(embed=True)`), its query parameters, or the keys it reads by hand from
`await request.json()`. From FastAPI's own analysis of the handler (`route.dependant`) when the
route's module imports, else from the handler's signature in source, read by FastAPI's rules.

Standard library only (runs under the engine's interpreter). Belongs here: reading handlers. Does
not: finding routes or classes (`probe_code.py`), judging requests (`probe_main.py`).
"""

from __future__ import annotations

import ast
import typing
from dataclasses import dataclass, field

from probe_code import IMPORTED, SOURCE, Code, Fields, Route, _classes_in, imported_fields, where_of

NOT_PARAMS = {"Request", "Response", "BackgroundTasks", "WebSocket", "HTTPConnection"}
SCALARS = {"str", "int", "float", "bool"}


@dataclass
class Takes:
    """What one handler accepts."""

    path: str                                       # IMPORTED or SOURCE
    where: str                                      # the handler, "module:line"
    body_model: Fields | None = None                # the whole JSON body is this model
    embedded: dict[str, Fields | None] = field(default_factory=dict)  # body keys (Body(embed=True))
    embedded_types: dict[str, object] = field(default_factory=dict)   # their annotations (imported)
    query: dict[str, tuple | None] = field(default_factory=dict)      # name -> allowed values (a Literal) or None
    raw_keys: set[str] | None = None                # keys read by hand from request.json()
    note: str = ""

    def takes_body(self) -> bool:
        return self.body_model is not None or bool(self.embedded) or self.raw_keys is not None


def handler_takes(code: Code, route: Route) -> Takes:
    if route.how == IMPORTED and route.endpoint is not None and hasattr(route.endpoint, "dependant"):
        takes = _imported_takes(route)
    else:
        takes = _source_takes(code, route)
    if not takes.takes_body():
        node = code.handler_node(route)
        if node is not None and ".json()" in ast.unparse(node):
            takes.raw_keys = code.string_keys(route.module, node.name)
            takes.note = f"{node.name} reads request.json() by hand; the keys are those it looks up"
    return takes


def _imported_takes(route: Route) -> Takes:
    from fastapi.dependencies.utils import _should_embed_body_fields  # the engine's own FastAPI

    dependant = route.endpoint.dependant
    out = Takes(IMPORTED, route.where)
    body = list(dependant.body_params)
    if body and not _should_embed_body_fields(body):
        annotation = body[0].field_info.annotation
        classes = _classes_in(annotation)
        out.body_model = imported_fields(classes[0], False) if classes else None
    else:
        for f in body:
            classes = [c for c in _classes_in(f.field_info.annotation) if imported_fields(c, False).names]
            out.embedded[f.alias or f.name] = imported_fields(classes[0], False) if classes else None
            out.embedded_types[f.alias or f.name] = f.field_info.annotation
    for q in dependant.query_params:
        out.query[q.alias or q.name] = _literal_values(q.field_info.annotation)
    return out


def _literal_values(hint) -> tuple | None:
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    for arg in typing.get_args(hint):
        found = _literal_values(arg)
        if found:
            return found
    return None


def _source_takes(code: Code, route: Route) -> Takes:
    node = code.handler_node(route)
    out = Takes(SOURCE, route.where)
    if node is None:
        out.note = f"handler {route.handler} not found in source"
        return out
    args = node.args
    defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    pairs = list(zip(args.args, defaults)) + list(zip(args.kwonlyargs, args.kw_defaults))
    bodies: list[tuple[str, str, bool]] = []   # (name, type name, embed)
    for arg, default in pairs:
        if arg.annotation is None or "{" + arg.arg in route.path:
            continue
        kind, type_name, embed = _param_kind(arg.annotation, default)
        if type_name in NOT_PARAMS:
            continue
        if kind == "query" or (kind is None and (type_name in SCALARS or _is_literal_alias(code, route.module, type_name))):
            out.query[arg.arg] = _source_literal(code, route.module, type_name)
        else:
            bodies.append((arg.arg, type_name, embed))
    if len(bodies) == 1 and not bodies[0][2]:
        found = code.find_class(route.module, bodies[0][1])
        out.body_model = code.source_fields(*found) if found else None
        if found is None:
            out.embedded[bodies[0][0]] = None
    else:
        for name, type_name, _embed in bodies:
            found = code.find_class(route.module, type_name)
            out.embedded[name] = code.source_fields(*found) if found else None
    return out


def _param_kind(annotation, default) -> tuple[str | None, str, bool]:
    """("body"/"query"/None, the type's name, embed) of one handler parameter."""
    kind, embed = None, False
    inner = annotation
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value).endswith("Annotated"):
        elts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        inner = elts[0]
        for marker in elts[1:]:
            kind, embed = _marker(marker) or (kind, embed)
    if default is not None:
        kind, embed = _marker(default) or (kind, embed)
    names = [n.id for n in ast.walk(inner) if isinstance(n, ast.Name) and n.id not in ("None", "Optional", "Union")]
    return kind, (names[0] if names else ast.unparse(inner)), embed


def _marker(node) -> tuple[str, bool] | None:
    if isinstance(node, ast.Call):
        fname = getattr(node.func, "id", getattr(node.func, "attr", ""))
        if fname == "Query":
            return "query", False
        if fname == "Body":
            return "body", any(k.arg == "embed" and getattr(k.value, "value", False) is True for k in node.keywords)
    return None


def _alias_value(code: Code, module: str, name: str, depth: int = 0):
    tree = code.tree(module)
    for node in tree.body if tree else ():
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                return node.value
    origin = code.imported_name(module, name)
    return _alias_value(code, origin[0], origin[1], depth + 1) if origin and depth < 5 else None


def _is_literal_alias(code: Code, module: str, name: str) -> bool:
    value = _alias_value(code, module, name)
    return value is not None and ast.unparse(value).startswith(("Literal", "typing.Literal"))


def _source_literal(code: Code, module: str, name: str) -> tuple | None:
    value = _alias_value(code, module, name)
    if value is None or not _is_literal_alias(code, module, name):
        return None
    elts = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
    return tuple(e.value for e in elts if isinstance(e, ast.Constant))


__all__ = ["Takes", "handler_takes", "where_of"]
