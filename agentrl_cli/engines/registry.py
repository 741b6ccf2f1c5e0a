"""Which engine `inference.engine` names: a row of `ENGINES` (name -> "module:Class") or the
`module:Class` path of an engine of your own (docs/engines.md). An unknown name lists the rows.
Adding an engine: its module and a row in `agentrl_cli/core/parts.py` ENGINES (the config reads the
names from the rows)."""

from __future__ import annotations

from functools import lru_cache

from agentrl_cli.core import parts
from agentrl_cli.core.errors import ConfigError, NotFoundError
from agentrl_cli.core.plugins import load_class
from agentrl_cli.engines.engine import InferenceEngine

ENGINES: dict[str, str] = parts.table(parts.ENGINES)  # the rows: core/parts.py
KEY = "inference.engine"


@lru_cache(maxsize=None)
def engine_class(name: str) -> type:
    """The engine class `name` (a registered name or a `module:Class` path) stands for."""
    return load_class("inference engine", name, ENGINES, KEY)


# engines that speak another engine's protocol: (engine, dialect) -> "module:Class" (`inference.dialect`)
DIALECTS: dict[tuple[str, str], str] = {("hf", "vllm"): "agentrl_cli.engines.embedded_vllm:EmbeddedVLLMEngine"}
DIALECT_KEY = "inference.dialect"


def engine_named(name: str, dialect: str = "") -> InferenceEngine:
    """Engine `name`, speaking `dialect` ("" = its own protocol)."""
    if (name, dialect) in DIALECTS:
        return load_class("inference engine", DIALECTS[name, dialect], {}, DIALECT_KEY)()
    engine = engine_class(name)()
    own = getattr(engine, "dialect", None)
    if dialect and dialect != own:
        raise ConfigError(f"{DIALECT_KEY} {dialect!r}: the {engine.title} engine ({KEY} {name!r}) speaks "
                          f"{own or 'its own protocol'}, not {dialect}",
                          f"unset {DIALECT_KEY}; only the embedded server ({KEY}: hf) speaks another engine's protocol")
    return engine


def engine_for(config) -> InferenceEngine:
    """The engine of a platform config (`config.inference.engine`, speaking `inference.dialect`)."""
    return engine_named(config.inference.engine, getattr(config.inference, "dialect", ""))


def engine_ref(engine) -> str:
    """How a config names `engine`'s class: its registered name, else its `module:Class` path (what a
    server started by the run is told with `agentrl serve inference --engine`)."""
    cls = type(engine)
    path = f"{cls.__module__}:{cls.__qualname__}"
    dialect_of = {target: name for (name, _), target in DIALECTS.items()}
    return next((name for name, target in ENGINES.items() if target == path), dialect_of.get(path, path))


def engine_packages(name: str | None = None) -> tuple[str, ...]:
    """The distributions of every registered engine, then those of engine `name` (a `module:Class`
    path that does not load adds none): what a run's record lists the versions of."""
    out: list[str] = []
    for engine in (*ENGINES, *([name] if name and name not in ENGINES else [])):
        try:
            packages = engine_class(engine).lock_packages
        except NotFoundError:
            continue
        out += [p for p in packages if p not in out]
    return tuple(out)
