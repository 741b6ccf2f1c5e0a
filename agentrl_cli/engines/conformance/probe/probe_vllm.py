"""vLLM's side of the conformance probe: where vLLM keeps what agentrl's requests must match.

- the launch: `python -m vllm.entrypoints.cli.main serve MODEL ...`, whose flags the parser of
  `vllm.entrypoints.common.cli_args.make_arg_parser(FlexibleArgumentParser())` takes;
- the routes: every FastAPI router under `vllm.entrypoints` (the RL routes of `vllm.entrypoints.rl`
  and the dev routes of `vllm.entrypoints.serve.dev` are registered only with VLLM_SERVER_DEV_MODE=1,
  `launchers/api_server/routers.py`; agentrl's launch sets it, so they count, and each says so);
- the bodies: each handler's pydantic models, `Body(embed=True)` and `Query` parameters; the weight
  transfer's `init_info` and `update_info` dicts against the NCCL backend's dataclasses;
- the answers: the response models (`GenerateTokensResponse`), else the dict a handler returns.

vLLM reads its platform when its config modules import; on a machine without a GPU the probe sets
VLLM_TARGET_DEVICE=cpu (unless set) so they import. Standard library only.
Does not: the generic judging (`probe_main.py`).
"""

from __future__ import annotations

import os

from probe_code import IMPORTED, SOURCE, Code, Route, where_of
from probe_main import check_argv_with, check_flags_in, item

SERVER_MODULE = "vllm.entrypoints.cli.main"
CLI_ARGS = "vllm.entrypoints.common.cli_args"
ARGPARSE = "vllm.utils.argparse_utils"
DEV_ONLY = ("vllm.entrypoints.rl.", "vllm.entrypoints.serve.dev.")
NESTED = {
    ("/init_weight_transfer_engine", "init_info"): ("vllm.distributed.weight_transfer.nccl_common", "NCCLWeightTransferInitInfo"),
    ("/update_weights", "update_info"): ("vllm.distributed.weight_transfer.nccl_engine", "NCCLWeightTransferUpdateInfo"),
}
RESPONSES = {"/inference/v1/generate": ("vllm.entrypoints.scale_out.token_in_token_out.protocol", "GenerateTokensResponse")}
SET_BY_PROBE: list[str] = []


def setup() -> None:
    for key, value in (("VLLM_TARGET_DEVICE", "cpu"), ("VLLM_SERVER_DEV_MODE", "1")):
        if key not in os.environ:
            os.environ[key] = value
            SET_BY_PROBE.append(f"{key}={value}")


class Rules:
    package = distribution = "vllm"
    title = "vLLM"

    def __init__(self):
        self.notes: list[str] = [f"the probe set {', '.join(SET_BY_PROBE)}"] if SET_BY_PROBE else []
        self.table_where, self.table_path = "vllm.entrypoints (its APIRouters)", SOURCE

    # ---- the launch ----------------------------------------------------------------------------
    def check_argv(self, code: Code, argv: list[str]) -> list[dict]:
        if argv[:3] != ["-m", SERVER_MODULE, "serve"]:
            return [item("argv", " ".join(argv[:3]), f"the server is started with -m {SERVER_MODULE} serve, "
                         f"not {' '.join(argv[:3])}", SERVER_MODULE, SOURCE)]
        cli, argparse_utils = code.load(CLI_ARGS), code.load(ARGPARSE)
        if cli is not None and argparse_utils is not None:
            try:
                parser = cli.make_arg_parser(argparse_utils.FlexibleArgumentParser(prog="vllm serve"))
            except Exception as exc:  # noqa: BLE001 - e.g. no platform
                code.import_errors[CLI_ARGS + ".make_arg_parser"] = f"{type(exc).__name__}: {exc}"[:400]
            else:
                where = f"{where_of(cli.make_arg_parser)} make_arg_parser"
                return check_argv_with(parser, argv[3:], where, IMPORTED)
        self.notes.append(f"argv: vLLM's parser could not be built here ({code.import_errors}); flag names read from source")
        options = {s for s in code.string_constants(CLI_ARGS) if s.startswith("--")}
        for module, cls in (("vllm.engine.arg_utils", "EngineArgs"), (CLI_ARGS, "FrontendArgs")):
            found = code.find_class(module, cls)
            if found:
                options |= {"--" + n.replace("_", "-") for n in code.source_fields(*found).names}
        return check_flags_in(options, argv[3:], "vllm.engine.arg_utils.EngineArgs, vllm.entrypoints.common.cli_args.FrontendArgs")

    # ---- routes --------------------------------------------------------------------------------
    def routes(self, code: Code) -> list[Route]:
        table: list[Route] = []
        for module in code.modules_under("vllm.entrypoints"):
            source = code.source_routes(module, set())
            if not source:
                continue
            if module.endswith("dp_supervisor"):  # the data-parallel supervisor's own app, not a server's
                continue
            imported = _imported_routes(code, module)
            for route in source:
                real = imported.get((route.path, frozenset(route.methods)))
                if real is not None:
                    route.how, route.endpoint = IMPORTED, real
                if module.startswith(DEV_ONLY):
                    route.note = "registered only with VLLM_SERVER_DEV_MODE=1 (launchers/api_server/routers.py); agentrl's launch sets it"
                table.append(route)
        self.table_path = IMPORTED if any(r.how == IMPORTED for r in table) else SOURCE
        unimported = sorted({r.module for r in table if r.how == SOURCE and r.note != "mounted"})
        if unimported:
            self.notes.append(f"routes read from source (their modules do not import here): {', '.join(unimported)}")
        return table

    # ---- bodies --------------------------------------------------------------------------------
    def nested(self, code: Code, route_path: str, key: str):
        target = NESTED.get((route_path, key))
        return code.fields(*target) if target else None

    def check_body_extra(self, code: Code, route_path: str, body: dict) -> list[dict]:
        return []

    # ---- answers -------------------------------------------------------------------------------
    def answer(self, code: Code, route: Route):
        if route.path in RESPONSES:
            return code.fields(*RESPONSES[route.path])
        if route.note == "mounted":
            return None
        node = code.handler_node(route)
        if node is None:
            return None
        return {"": (code.string_keys(route.module, node.name), f"{route.module}.{node.name} (the dict it returns)", SOURCE)}


def _imported_routes(code: Code, module: str) -> dict:
    mod = code.load(module)
    out = {}
    for value in vars(mod).values() if mod is not None else ():
        for r in getattr(value, "routes", None) or () if type(value).__name__ in ("APIRouter", "FastAPI") else ():
            if hasattr(r, "dependant"):
                out[(r.path, frozenset(r.methods or ()))] = r
    return out
