"""SGLang's side of the conformance probe: where SGLang keeps what agentrl's requests must match.

- the launch: `python -m sglang.launch_server`, whose flags `sglang.srt.server_args.prepare_server_args`
  parses with a parser built by `ServerArgs.add_cli_args` (built the same way here);
- the routes: the FastAPI `app` of `sglang.srt.entrypoints.http_server` (and the routers it includes),
  plus `/metrics`, mounted at start-up by `sglang.srt.utils.common.add_prometheus_middleware`;
- the bodies: the dataclass each handler takes (`sglang.srt.managers.io_struct`), `sampling_params`
  against `sglang.srt.sampling.sampling_params.SamplingParams`, and /generate's JSON contract gate
  (`sglang.api.v1.api_types.GenerateRequest`, which the handler runs on every body);
- the answers: the keys SGLang's tokenizer manager sets (/generate's `meta_info`), the dicts the
  /model_info and /server_info handlers build, the metric names of its metrics collector.

Standard library only (runs under SGLang's interpreter). Does not: the generic judging (`probe_main.py`).
"""

from __future__ import annotations

import argparse
import inspect

from probe_code import IMPORTED, SOURCE, Code, Route, where_of
from probe_main import check_argv_with, check_flags_in, item

SERVER_MODULE = "sglang.launch_server"
HTTP = "sglang.srt.entrypoints.http_server"
ARGS = "sglang.srt.server_args"
SAMPLING = ("sglang.srt.sampling.sampling_params", "SamplingParams")
CONTRACT = "sglang.api.v1.api_types"
TOKENIZER_MANAGER = "sglang.srt.managers.tokenizer_manager"
METRICS = "sglang.srt.observability.metrics_collector"
PROMETHEUS = "sglang.srt.utils.common"


def setup() -> None:
    """Nothing to set: SGLang's modules read no switch that changes what they declare."""


class Rules:
    package = distribution = "sglang"
    title = "SGLang"

    def __init__(self):
        self.notes: list[str] = []
        self.table_where, self.table_path = HTTP, SOURCE

    # ---- the launch ----------------------------------------------------------------------------
    def check_argv(self, code: Code, argv: list[str]) -> list[dict]:
        if argv[:2] != ["-m", SERVER_MODULE]:
            return [item("argv", " ".join(argv[:2]), f"the server is started with -m {SERVER_MODULE}, "
                         f"not {' '.join(argv[:2])}", SERVER_MODULE, SOURCE)]
        if code.file(SERVER_MODULE) is None:
            return [item("argv", SERVER_MODULE, f"{SERVER_MODULE} is not in the installed package", code.root, SOURCE)]
        rest = argv[2:]
        module = code.load(ARGS)
        if module is not None:
            parser = argparse.ArgumentParser(prog="sglang serve")  # as prepare_server_args builds it
            module.ServerArgs.add_cli_args(parser)
            where = f"{ARGS}:{inspect.getsourcelines(module.ServerArgs.add_cli_args)[1]} ServerArgs.add_cli_args"
            return check_argv_with(parser, rest, where, IMPORTED)
        self.notes.append(f"argv: {ARGS} does not import here ({code.import_errors[ARGS]}); flag names read from source")
        options = set()
        for mod in [ARGS, *code.modules_under("sglang.srt.arg_groups")]:
            tree = code.tree(mod)
            options |= {s for s in code.string_constants(mod) if s.startswith("--")}
            for cls in [n for n in (tree.body if tree else ()) if n.__class__.__name__ == "ClassDef"]:
                options |= {"--" + name.replace("_", "-") for name in code.source_fields(mod, cls).names}
        return check_flags_in(options, rest, f"{ARGS} (ServerArgs and sglang.srt.arg_groups)")

    # ---- routes --------------------------------------------------------------------------------
    def routes(self, code: Code) -> list[Route]:
        module = code.load(HTTP)
        if module is not None:
            table = imported_routes(module.app)
            self.table_path = IMPORTED
        else:
            self.notes.append(f"routes: {HTTP} does not import here ({code.import_errors[HTTP]}); its route "
                              "decorators were read from source")
            table = code.source_routes(HTTP)
        for mount in [r for r in code.source_routes(PROMETHEUS) if r.note == "mounted"]:
            mount.note = "mounted at start-up by add_prometheus_middleware when the server runs with --enable-metrics"
            table.append(mount)
        return table

    # ---- bodies --------------------------------------------------------------------------------
    def nested(self, code: Code, route_path: str, key: str):
        if route_path == "/generate" and key == "sampling_params":
            return code.fields(*SAMPLING)
        return None

    def check_body_extra(self, code: Code, route_path: str, body: dict) -> list[dict]:
        """/generate's handler refuses a body its JSON contract (`GenerateRequest`) rejects."""
        if route_path != "/generate":
            return []
        contract = code.load_file(CONTRACT)
        if contract is None:
            return [item("body", "/generate contract", None, CONTRACT, SOURCE,
                         note=f"the JSON contract gate was not run: {CONTRACT} does not load here")]
        where = code.class_where(CONTRACT, "GenerateRequest")
        try:
            contract.GenerateRequest.from_json_value(body)
        except contract.JsonContractError as exc:
            return [item("body", "/generate contract", f"SGLang's JSON contract refuses the body: {exc}", where, IMPORTED)]
        return [item("body", "/generate contract", None, where, IMPORTED, note="loaded from its file alone")]

    # ---- answers -------------------------------------------------------------------------------
    def answer(self, code: Code, route: Route):
        if route.path == "/generate":
            keys = code.string_keys(TOKENIZER_MANAGER)
            where = f"{TOKENIZER_MANAGER} (the keys it sets in the answer and its meta_info)"
            return {"": (keys, where, SOURCE), "meta_info": (keys, where, SOURCE)}
        if route.path in ("/model_info", "/server_info"):
            handler = route.path.strip("/")
            states = set().union(*(code.string_keys(m) for m in code.modules_under("sglang.srt.managers")))
            return {"": (code.string_keys(HTTP, handler), f"{HTTP}.{handler}", SOURCE),
                    "internal_states": (states, "sglang.srt.managers (the scheduler's internal state keys)", SOURCE)}
        if route.path == "/metrics":
            names = {s for s in code.string_constants(METRICS) if s.startswith("sglang:")}
            return {"": (names, f"{METRICS} (its Prometheus metric names)", SOURCE)}
        return None


def imported_routes(app) -> list[Route]:
    out = []
    for r in _walk(app.routes):
        endpoint = getattr(r, "endpoint", None)
        if endpoint is None or not hasattr(r, "path"):
            continue
        fn = inspect.unwrap(endpoint)
        out.append(Route(r.path, set(getattr(r, "methods", None) or {"GET"}), where_of(fn), fn.__name__,
                         fn.__module__, IMPORTED, endpoint=r))
    return out


def _walk(routes):
    for r in routes:
        if hasattr(r, "original_router"):  # FastAPI's included router
            yield from _walk(r.original_router.routes)
        else:
            yield r


__all__ = ["Rules", "setup", "imported_routes"]
