"""Reading an installed engine's own code, for the conformance probe (`probe_main.py`): import the
real module when it imports on this machine, else parse the installed package's source with `ast`.
Every answer says which of the two it came from ("imported" or "source", with the import error).

Runs under the engine's interpreter, with no agentrl installed: standard library only (pydantic,
msgspec and fastapi are used only through the engine's own imported modules).
Belongs here: finding modules, classes, fields, routes, handler parameters and string keys in the
engine's code. Does not: any one engine's knowledge (`probe_sglang.py`, `probe_vllm.py`), judging a
request (`probe_main.py`).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
import typing
from dataclasses import dataclass, field

IMPORTED, SOURCE = "imported", "source"
ROUTE_METHODS = {"get", "post", "put", "delete", "patch"}
SKIP_BASES = {"BaseModel", "object", "Struct", "ABC", "Generic", "OpenAIBaseModel", "PydanticMsgspecMixin"}


@dataclass
class Fields:
    """The fields a class takes: name -> where it is declared, plus aliases and whether extras pass."""

    owner: str                                   # "module.Class"
    where: str                                   # "module:line"
    path: str                                    # IMPORTED or SOURCE
    names: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)   # alias -> field name
    extra_allowed: bool = False
    cls: object = None                           # the class, when imported
    node: object = None                          # (module, ClassDef), when read from source

    def knows(self, key: str) -> bool:
        return self.extra_allowed or key in self.names or key in self.aliases


@dataclass
class Route:
    path: str
    methods: set[str]
    where: str                                   # "module:line" of the handler
    handler: str                                 # the handler's name
    module: str
    how: str                                     # IMPORTED or SOURCE
    endpoint: object = None                      # the FastAPI route, when imported
    note: str = ""


class Code:
    """One engine package's code, imported where it can be, read from source where it cannot."""

    def __init__(self, package: str):
        self.package = package
        spec = importlib.util.find_spec(package)  # a top-level name: finds, does not import
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(f"no package {package!r} for this interpreter")
        self.root = list(spec.submodule_search_locations)[0]
        self.import_errors: dict[str, str] = {}
        self._trees: dict[str, ast.Module] = {}

    # ---- modules -------------------------------------------------------------------------------
    def file(self, module: str) -> str | None:
        parts = module.split(".")
        if parts[0] != self.package:
            return None
        base = os.path.join(self.root, *parts[1:])
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = self.file(module)
            if path is None:
                return None
            with open(path, encoding="utf-8") as f:
                self._trees[module] = ast.parse(f.read(), path)
        return self._trees[module]

    def load(self, module: str):
        """The imported module, or None (the error is kept in `import_errors`)."""
        if module in self.import_errors:
            return None
        try:
            return importlib.import_module(module)
        except BaseException as exc:  # noqa: BLE001 - an engine module may exit or raise anything on import
            self.import_errors[module] = f"{type(exc).__name__}: {exc}".strip()[:400]
            return None

    def load_file(self, module: str):
        """`module` executed from its installed file alone, without importing its package (whose
        `__init__` may need GPU-only libraries): for self-contained modules such as generated codecs."""
        path = self.file(module)
        if path is None:
            return None
        try:
            spec = importlib.util.spec_from_file_location(f"_probe_{module.replace('.', '_')}", path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod  # dataclasses, msgspec and inspect look their module up there
            spec.loader.exec_module(mod)
            return mod
        except BaseException as exc:  # noqa: BLE001
            self.import_errors[module + " (by file)"] = f"{type(exc).__name__}: {exc}"[:400]
            return None

    def modules_under(self, subpackage: str) -> list[str]:
        top = os.path.join(self.root, *subpackage.split(".")[1:])
        out = []
        for dirpath, _dirs, files in os.walk(top):
            for name in sorted(files):
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, name), self.root)[:-3].split(os.sep)
                    if rel[-1] == "__init__":
                        rel = rel[:-1]
                    out.append(".".join([self.package, *rel]))
        return sorted(out)

    # ---- names ---------------------------------------------------------------------------------
    def imported_name(self, module: str, name: str) -> tuple[str, str] | None:
        """Where `name`, as used in `module`, comes from: (its module, its name there)."""
        tree = self.tree(module)
        if tree is None:
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return _absolute(module, node, self.file(module)), alias.name
        return None

    def find_class(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        tree = self.tree(module)
        if tree is None or depth > 6:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        origin = self.imported_name(module, name)
        return self.find_class(origin[0], origin[1], depth + 1) if origin else None

    def class_where(self, module: str, name: str) -> str:
        found = self.find_class(module, name)
        return f"{found[0]}:{found[1].lineno} {name}" if found else f"{module}.{name}"

    def find_function(self, module: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        tree = self.tree(module)
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return node
        return None

    # ---- fields --------------------------------------------------------------------------------
    def fields(self, module: str, name: str, *, init_params: bool = False) -> Fields | None:
        """The fields of class `name` in `module`: imported when the module imports, else from source.
        `init_params`: its `__init__`'s keyword parameters (a class whose fields are set by hand)."""
        mod = self.load(module)
        cls = getattr(mod, name, None) if mod is not None else None
        if cls is not None:
            return imported_fields(cls, init_params)
        found = self.find_class(module, name)
        return self.source_fields(*found, init_params=init_params) if found else None

    def source_fields(self, module: str, node: ast.ClassDef, *, init_params: bool = False) -> Fields:
        out = Fields(f"{module}.{node.name}", f"{module}:{node.lineno}", SOURCE, node=(module, node))
        for base in node.bases:
            base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            if base_name and base_name not in SKIP_BASES:
                found = self.find_class(module, base_name)
                if found:
                    inherited = self.source_fields(*found, init_params=init_params)
                    out.names.update(inherited.names)
                    out.aliases.update(inherited.aliases)
                    out.extra_allowed |= inherited.extra_allowed
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init_params and init is not None:
            args = init.args
            for a in [*args.args[1:], *args.kwonlyargs]:
                out.names[a.arg] = f"{module}:{a.lineno}"
            return out
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if stmt.target.id.startswith("_") or "ClassVar" in ast.unparse(stmt.annotation):
                    continue
                out.names[stmt.target.id] = f"{module}:{stmt.lineno}"
                alias = _keyword_str(stmt.value, "alias") or _keyword_str(stmt.value, "validation_alias")
                if alias:
                    out.aliases[alias] = stmt.target.id
            elif isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "model_config" for t in stmt.targets):
                out.extra_allowed |= "'allow'" in ast.unparse(stmt.value) or '"allow"' in ast.unparse(stmt.value)
        return out

    def field_class(self, owner: Fields, name: str) -> Fields | None:
        """The class a field's annotation names (through Optional, list, Annotated, unions), as Fields."""
        if owner.path == IMPORTED:
            hint = _imported_annotation(owner.cls, name)
            for candidate in _classes_in(hint):
                fields = imported_fields(candidate, False)
                if fields.names:
                    return fields
            return None
        module, node = owner.node
        for cls_node in [node, *self._source_bases(module, node)]:
            mod, cnode = cls_node if isinstance(cls_node, tuple) else (module, cls_node)
            for stmt in cnode.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
                    for ident in [n.id for n in ast.walk(stmt.annotation) if isinstance(n, ast.Name)]:
                        found = self.find_class(mod, ident)
                        if found:
                            fields = self.source_fields(*found)
                            if fields.names:
                                return fields
        return None

    def _source_bases(self, module: str, node: ast.ClassDef) -> list:
        out = []
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id not in SKIP_BASES:
                found = self.find_class(module, base.id)
                if found:
                    out += [found, *self._source_bases(*found)]
        return out

    # ---- routes --------------------------------------------------------------------------------
    def source_routes(self, module: str, seen: set | None = None) -> list[Route]:
        """Route decorators (`@app.post("/x")`, `@router.api_route("/x", methods=[...])`), `add_api_route`
        and `Mount` calls in `module`, following `app.include_router(name)` to the module `name` comes from."""
        seen = seen if seen is not None else set()
        tree = self.tree(module)
        if tree is None or module in seen:
            return []
        seen.add(module)
        out: list[Route] = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for deco in node.decorator_list:
                    route = _decorator_route(deco)
                    if route:
                        out.append(Route(route[0], route[1], f"{module}:{node.lineno}", node.name, module, SOURCE))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "add_api_route" and node.args and isinstance(node.args[0], ast.Constant):
                    methods = _methods_kw(node) or {"GET"}
                    handler = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
                    out.append(Route(node.args[0].value, methods, f"{module}:{node.lineno}", handler, module, SOURCE))
                elif node.func.attr == "include_router" and node.args and isinstance(node.args[0], ast.Name):
                    origin = self.imported_name(module, node.args[0].id)
                    if origin:
                        out += self.source_routes(origin[0], seen)
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Mount":
                if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    out.append(Route(node.args[0].value, {"GET"}, f"{module}:{node.lineno}", "Mount", module, SOURCE,
                                     note="mounted"))
        return out

    def handler_node(self, route: Route):
        name = route.handler if route.how == SOURCE else getattr(route.endpoint.endpoint, "__name__", "")
        return self.find_function(route.module, name)

    def string_keys(self, module: str, function: str | None = None) -> set[str]:
        """String constants used as dict keys in `module` (or in its function `function`): dict
        literals' keys, `x["k"] = ...`, `x.get("k")`, and string tuples/lists of key names."""
        tree = self.tree(module)
        if tree is None:
            return set()
        scope = self.find_function(module, function) if function else tree
        keys: set[str] = set()
        for node in ast.walk(scope) if scope else ():
            if isinstance(node, ast.Dict):
                keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                keys.add(node.slice.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop", "setdefault"):
                if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    keys.add(node.args[0].value)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "dict":
                keys |= {k.arg for k in node.keywords if k.arg}
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                keys |= {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return keys

    def string_constants(self, module: str) -> dict[str, int]:
        tree = self.tree(module)
        return {n.value: n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)} if tree else {}


# ---- imported classes ----------------------------------------------------------------------------
def where_of(obj) -> str:
    try:
        return f"{obj.__module__}:{inspect.getsourcelines(obj)[1]}"
    except (TypeError, OSError, AttributeError):
        return getattr(obj, "__module__", "?")


def imported_fields(cls, init_params: bool) -> Fields:
    out = Fields(f"{cls.__module__}.{cls.__qualname__}", where_of(cls), IMPORTED, cls=cls)
    model_fields = getattr(cls, "model_fields", None)
    struct_fields = getattr(cls, "__struct_fields__", None)
    if init_params:
        for name, param in inspect.signature(cls.__init__).parameters.items():
            if name != "self" and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                out.names[name] = out.where
    elif isinstance(model_fields, dict):
        for name, info in model_fields.items():
            out.names[name] = out.where
            for alias in (info.alias, info.validation_alias if isinstance(info.validation_alias, str) else None):
                if alias:
                    out.aliases[alias] = name
        out.extra_allowed = (getattr(cls, "model_config", {}) or {}).get("extra") == "allow"
    elif struct_fields is not None:
        encode = getattr(cls, "__struct_encode_fields__", struct_fields)
        for name, wire in zip(struct_fields, encode):
            out.names[name] = out.where
            if wire != name:
                out.aliases[wire] = name
    elif dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.init and not f.name.startswith("_"):
                out.names[f.name] = out.where
    return out


def _imported_annotation(cls, name: str):
    model_fields = getattr(cls, "model_fields", None)
    if isinstance(model_fields, dict) and name in model_fields:
        return model_fields[name].annotation
    try:
        return typing.get_type_hints(cls, include_extras=True).get(name)
    except Exception:  # noqa: BLE001 - forward references an engine leaves unresolved
        return getattr(cls, "__annotations__", {}).get(name)


def _classes_in(hint) -> list:
    if hint is None:
        return []
    if inspect.isclass(hint) and hint.__module__ not in ("builtins", "typing"):
        return [hint]
    out = []
    for arg in typing.get_args(hint):
        out += _classes_in(arg)
    return out


# ---- source helpers ------------------------------------------------------------------------------
def _absolute(module: str, node: ast.ImportFrom, file: str | None) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".")
    if not (file or "").endswith("__init__.py"):
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _keyword_str(call, name: str) -> str | None:
    if isinstance(call, ast.Call):
        for kw in call.keywords:
            if kw.arg == name and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                return kw.value.value
    return None


def _methods_kw(call: ast.Call) -> set[str]:
    for kw in call.keywords:
        if kw.arg == "methods" and isinstance(kw.value, (ast.List, ast.Tuple, ast.Set)):
            return {e.value.upper() for e in kw.value.elts if isinstance(e, ast.Constant)}
    return set()


def _decorator_route(deco) -> tuple[str, set[str]] | None:
    if not (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute) and deco.args):
        return None
    first = deco.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith("/")):
        return None
    if deco.func.attr in ROUTE_METHODS:
        return first.value, {deco.func.attr.upper()}
    if deco.func.attr == "api_route":
        return first.value, _methods_kw(deco) or {"GET"}
    return None
