"""The conformance probe: holds agentrl's launch command line and requests against an inference
engine's OWN code, under the engine's interpreter. Run by path (it needs no agentrl there):

    ENGINE_PYTHON agentrl_cli/engines/conformance/probe/probe_main.py < surface.json

stdin: {"engine": "sglang"|"vllm", "argv": [...after the interpreter...], "calls": [WireCall dicts]}.
stdout: {"engine", "version", "python", "items": [{kind, what, ok, problem, where, path, note}],
"import_errors": {module: error}}. Each item's `path` says how the engine's code was read:
"imported" (its real module) or "source" (its installed source, parsed, because the import failed).

Standard library only. Belongs here: judging the argv, the routes, the bodies, the queries and the
fields read. Does not: reading code (`probe_code.py`, `probe_handlers.py`), one engine's knowledge
(`probe_sglang.py`, `probe_vllm.py`), agentrl's side (`../check.py`).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.metadata
import json
import re
import sys

from probe_code import IMPORTED, SOURCE, Code, Fields, Route
from probe_handlers import handler_takes

RULES = {"sglang": "probe_sglang", "vllm": "probe_vllm"}  # each engine's knowledge, one module each


def item(kind: str, what: str, problem: str | None, where: str, path: str, note: str = "") -> dict:
    return {"kind": kind, "what": what, "ok": problem is None, "problem": problem, "where": where, "path": path, "note": note}


def close(word: str, options) -> str:
    found = difflib.get_close_matches(word, sorted(options), n=3, cutoff=0.6)
    return f" (closest: {', '.join(found)})" if found else ""


# ---- argv ----------------------------------------------------------------------------------------
class _ParseError(Exception):
    pass


def check_argv_with(parser: argparse.ArgumentParser, argv: list[str], where: str, path: str) -> list[dict]:
    """`argv` through the engine's own parser: each unrecognized flag, then any error it raises."""
    def error(message):
        raise _ParseError(message)

    parser.error = error  # the engine's parser would print and exit; we want its message
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.error = error
    options = set(parser._option_string_actions)
    out = []
    try:
        _ns, unknown = parser.parse_known_args(list(argv))
    except _ParseError as exc:
        return [item("argv", " ".join(argv), f"{parser.prog}'s parser refuses the command line: {exc}", where, path)]
    except SystemExit as exc:
        return [item("argv", " ".join(argv), f"{parser.prog}'s parser exited ({exc.code})", where, path)]
    flags = [u for u in unknown if u.startswith("-")]
    for flag in flags:
        name = flag.split("=", 1)[0]
        out.append(item("argv", name, f"unknown flag {name}: not among the {len(options)} options of the engine's "
                        f"parser{close(name, options)}", where, path))
    if unknown and not flags:
        out.append(item("argv", " ".join(unknown), f"arguments the parser does not take: {' '.join(unknown)}", where, path))
    used = [a for a in argv if a.startswith("--")]
    if not out:
        out.append(item("argv", f"{len(used)} flags", None, where, path, note="parsed by the engine's own parser"))
    return out


def check_flags_in(options: set[str], argv: list[str], where: str) -> list[dict]:
    """Source path: only flag names can be checked (their values need the parser itself)."""
    out = []
    for flag in [a.split("=", 1)[0] for a in argv if a.startswith("--")]:
        if flag not in options:
            out.append(item("argv", flag, f"unknown flag {flag}: not among the {len(options)} options declared in "
                            f"the engine's source{close(flag, options)}", where, SOURCE))
    return out or [item("argv", "flags", None, where, SOURCE, note="flag names only: values were not parsed")]


# ---- routes --------------------------------------------------------------------------------------
def match_route(table: list[Route], path: str, method: str) -> tuple[Route | None, str | None]:
    same_path = [r for r in table if r.path == path or _template(r.path).fullmatch(path)]
    if not same_path:
        return None, None
    for r in same_path:
        if method in r.methods or (r.note == "mounted"):
            return r, None
    methods = sorted({m for r in same_path for m in r.methods})
    return same_path[0], f"{path} takes {', '.join(methods)}, not {method}"


def _template(path: str) -> re.Pattern:
    return re.compile(re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(path)).replace("\\{", "{"))


def check_call(code: Code, rules, table: list[Route], call: dict) -> list[dict]:
    method, path, what = call["method"], call["route"], call.get("what", call["route"])
    route, wrong_method = match_route(table, path, method)
    if route is None:
        sources = ", ".join(sorted({r.module for r in table}))[:300]
        return [item("route", f"{method} {path} ({what})", f"route {path} is not in {rules.title}'s route table "
                     f"({len(table)} routes from {sources}){close(path, {r.path for r in table})}", rules.table_where, rules.table_path)]
    out = [item("route", f"{method} {path} ({what})", wrong_method, route.where, route.how, route.note)]
    if wrong_method:
        return out
    if route.note == "mounted":
        return out + check_reads(code, rules, route, call)
    takes = handler_takes(code, route)
    out += check_body(code, rules, route, takes, call)
    out += check_query(route, takes, call)
    return out + check_reads(code, rules, route, call)


# ---- bodies and queries --------------------------------------------------------------------------
def check_body(code: Code, rules, route: Route, takes, call: dict) -> list[dict]:
    body, label = call.get("body"), f"{call['method']} {route.path} body"
    if not body:
        return []
    if not isinstance(body, dict):
        return [item("body", label, "the body is not a JSON object", takes.where, takes.path)]
    out: list[dict] = []
    if takes.body_model is not None:
        out += check_object(code, rules, route.path, body, takes.body_model, "")
        out += validate_imported(takes.body_model, body, label)
    elif takes.embedded:
        for key, value in body.items():
            if key not in takes.embedded:
                out.append(item("body", f"{label}: {key}", f"unknown field `{key}`: {route.handler} "
                                f"({takes.where}) takes {sorted(takes.embedded)}{close(key, takes.embedded)}", takes.where, takes.path))
                continue
            model = rules.nested(code, route.path, key) or takes.embedded[key]
            if model is not None and isinstance(value, dict):
                out += check_object(code, rules, route.path, value, model, key + ".")
                out += validate_imported(model, value, f"{label}: {key}")
            elif key in takes.embedded_types:
                out += validate_annotation(takes.embedded_types[key], value, f"{label}: {key}", takes.where)
    elif takes.raw_keys is not None:
        for key in body:
            if key not in takes.raw_keys:
                out.append(item("body", f"{label}: {key}", f"unknown field `{key}`: {route.handler} ({takes.where}) "
                                f"never reads it{close(key, takes.raw_keys)}", takes.where, SOURCE, takes.note))
    else:
        out.append(item("body", label, f"{route.handler} ({takes.where}) takes no body; the engine ignores "
                        f"{sorted(body)}", takes.where, takes.path, takes.note))
    out += rules.check_body_extra(code, route.path, body)
    if not any(not i["ok"] for i in out):
        out.append(item("body", label, None, (takes.body_model.where if takes.body_model else takes.where),
                        takes.body_model.path if takes.body_model else takes.path, takes.note))
    return [i for i in out if not i["ok"]] + [i for i in out if i["ok"]][-1:]


def check_object(code: Code, rules, route_path: str, obj: dict, model: Fields, prefix: str) -> list[dict]:
    out = []
    for key, value in obj.items():
        if not model.knows(key):
            options = set(model.names) | set(model.aliases)
            out.append(item("body", f"{route_path}: {prefix}{key}", f"unknown field `{prefix}{key}`: {model.owner} "
                            f"({model.where}) has no such field{close(key, options)}", model.where, model.path))
            continue
        if isinstance(value, dict) and value:
            nested = rules.nested(code, route_path, prefix + key) or code.field_class(model, model.aliases.get(key, key))
            if nested is not None:
                out += check_object(code, rules, route_path, value, nested, f"{prefix}{key}.")
    return out


def validate_imported(model: Fields, value, label: str) -> list[dict]:
    """The engine's own validation of `value` as `model` (pydantic, as FastAPI runs it), when imported."""
    if model.path != IMPORTED or model.cls is None:
        return []
    return validate_annotation(model.cls, value, label, model.where)


def validate_annotation(annotation, value, label: str, where: str) -> list[dict]:
    try:
        import pydantic
    except ImportError:
        return []
    try:
        pydantic.TypeAdapter(annotation).validate_python(value)
    except pydantic.ValidationError as exc:
        errors = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(body)'}: {e['msg']}" for e in exc.errors()[:5])
        return [item("body", label, f"rejected by the engine's validation: {errors}", where, IMPORTED)]
    except Exception as exc:  # noqa: BLE001 - a validator that needs a running server
        return [item("body", label, None, where, IMPORTED, note=f"type validation not run: {type(exc).__name__}: {exc}"[:200])]
    return []


def check_query(route: Route, takes, call: dict) -> list[dict]:
    out = []
    for key, value in (call.get("query") or {}).items():
        if key not in takes.query:
            out.append(item("query", f"{route.path}?{key}", f"unknown query parameter `{key}`: {route.handler} "
                            f"({takes.where}) takes {sorted(takes.query)}{close(key, takes.query)}", takes.where, takes.path))
        elif takes.query[key] and value not in takes.query[key]:
            out.append(item("query", f"{route.path}?{key}={value}", f"`{key}` takes one of {list(takes.query[key])}, "
                            f"not {value!r}", takes.where, takes.path))
        else:
            out.append(item("query", f"{route.path}?{key}={value}", None, takes.where, takes.path))
    return out


# ---- answers -------------------------------------------------------------------------------------
def check_reads(code: Code, rules, route: Route, call: dict) -> list[dict]:
    out = []
    for read in call.get("reads") or ():
        segments = [s for s in read.replace("[]", "").split(".") if s]
        answer = rules.answer(code, route)
        if answer is None:
            out.append(item("read", f"{route.path} -> {read}", None, route.where, route.how,
                            note="not checked: no answer model known for this route"))
            continue
        out.append(check_read(code, route.path, read, segments, answer))
    return out


def check_read(code: Code, path: str, read: str, segments: list[str], answer) -> dict:
    """`answer`: a Fields (a response model), or {prefix: (keys, where, path)} of string keys the engine
    sets, by where they sit ("" = the top level, "meta_info" = inside it)."""
    label = f"{path} -> {read}"
    if isinstance(answer, Fields):
        model, checked = answer, []
        for seg in segments:
            if model is None:
                return item("read", label, None, answer.where, answer.path, note=f"checked down to {'.'.join(checked)}")
            if not model.knows(seg):
                return item("read", label, f"the answer has no field `{seg}`: {model.owner} ({model.where}) "
                            f"has {sorted(model.names)[:40]}{close(seg, model.names)}", model.where, model.path)
            checked.append(seg)
            model = code.field_class(model, model.aliases.get(seg, seg))
        return item("read", label, None, answer.where, answer.path)
    prefix, checked = "", []
    for seg in segments:
        if prefix not in answer:
            break
        keys, where, how = answer[prefix]
        if seg not in keys:
            return item("read", label, f"`{seg}` is never set in the engine's answer: not a key in {where}"
                        f"{close(seg, keys)}", where, how)
        checked.append(seg)
        prefix = seg
    keys, where, how = answer[""]
    note = "" if len(checked) == len(segments) else f"checked down to {'.'.join(checked)}"
    return item("read", label, None, where, how, note=note)


# ---- main ----------------------------------------------------------------------------------------
def run(request: dict) -> dict:
    engine = request["engine"]
    if engine not in RULES:
        raise SystemExit(f"probe: unknown engine {engine!r} ({', '.join(RULES)})")
    rules_module = importlib.import_module(RULES[engine])
    rules_module.setup()
    rules = rules_module.Rules()
    code = Code(rules.package)
    version = importlib.metadata.version(rules.distribution)
    items = rules.check_argv(code, list(request.get("argv") or []))
    table = rules.routes(code)
    for call in request.get("calls") or []:
        items += check_call(code, rules, table, call)
    return {"engine": engine, "version": version, "python": sys.executable, "items": items,
            "import_errors": code.import_errors, "notes": rules.notes}


def main() -> None:
    request = json.loads(sys.stdin.read())
    result = run(request)
    sys.stdout.write("\n@@PROBE-RESULT@@\n" + json.dumps(result, default=str) + "\n")


if __name__ == "__main__":
    main()
