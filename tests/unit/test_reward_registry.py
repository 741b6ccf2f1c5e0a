"""The reward's scorers by name (agentrl_cli/runtime/reward/registry.py): the table the config accepts, built
lazily as `Class(config)`; user reward functions named `module:function` and their contract (a
number in [0, 1] or a Verdict; anything else, an exception or a score outside [0, 1] is infra_error,
retried and counted; a tampered trajectory scores 0 without the function being called); their
version (`__version__`, else the source's hash) in verifier_versions and the cache key; and names
that cannot be loaded refused at config load or scorer build with exit 2 and the fix."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import threading

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.config.models import VERIFIER_NAMES
from agentrl_cli.core.errors import EXIT_USAGE, ConfigError, NotFoundError
from agentrl_cli.runtime.reward.models import ScoreRequest
from agentrl_cli.runtime.reward.registry import VERIFIERS, FunctionVerifier, build_verifier
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.reward.verifiers import Verdict, VerifierError


def config(*sets: str):
    return load_config(None, list(sets), env={}).config


def request(meta: dict | None = None, **kw) -> ScoreRequest:
    return ScoreRequest.model_validate({"task": {"task_id": "t/1", "harness": "h", "prompt": "p", "answer": "4",
                                                 "meta": meta or {}},
                                        "trajectory_id": "tr-1", "steps": [{"action": "ANSWER: 4"}], "final_answer": "4", **kw})


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Writes `name.py` with `source` where imports find it; returns the module name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name
    return write


class Built:
    name, version = "built", "7"

    def __init__(self, config) -> None:
        self.config = config

    def verify(self, req: ScoreRequest) -> Verdict:
        return Verdict(0.25, detail=f"built from a config with timeout {self.config.reward.timeout_s:g}")


def test_the_table_holds_the_judge_and_the_reward_model_and_the_config_accepts_exactly_it():
    assert VERIFIERS["judge"] == "agentrl_cli.runtime.reward.judge:JudgeVerifier"
    assert VERIFIERS["reward_model"] == "agentrl_cli.runtime.reward.reward_model:RewardModelVerifier"
    assert set(VERIFIER_NAMES) == set(VERIFIERS)


def test_importing_the_scorer_loads_no_registered_scorer():
    code = ("import sys, agentrl_cli.runtime.reward.scorer, agentrl_cli.runtime.reward.service; "
            "print([m for m in sys.modules if m in ('agentrl_cli.runtime.reward.judge', 'agentrl_cli.runtime.reward.reward_model')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_a_registered_name_is_built_from_the_config_when_a_task_names_it(monkeypatch):
    monkeypatch.setitem(VERIFIERS, "built", f"{__name__}:Built")
    s = Scorer(config=config("reward.timeout_s=7"), backoff_s=0.0)
    try:
        result = s.score(request({"verify": "built"}))
    finally:
        s.close()
    assert (result.verifier, result.components["outcome"], result.verifier_versions["built"]) == ("built", 0.25, "7")
    assert "timeout 7" in result.detail
    with pytest.raises(NotFoundError, match="Scorer.from_config"):
        build_verifier("built", None)


def test_an_unknown_name_is_refused_at_load_naming_the_registered_ones():
    with pytest.raises(ConfigError) as info:
        config('reward.verifiers=["jugde"]')
    assert "reward.verifiers" in info.value.message and "judge, reward_model" in info.value.message
    assert "module:function" in info.value.message
    with pytest.raises(ConfigError, match="built-in component"):
        config('reward.verifiers=["format"]')
    with pytest.raises(NotFoundError) as built:
        build_verifier("jugde", None)
    assert "registered: judge, reward_model" in built.value.message and built.value.exit_code == EXIT_USAGE


def test_a_function_that_cannot_be_imported_stops_the_scorer_build_and_the_service_with_exit_2(cli):
    cfg = config('reward.verifiers=["no_such_rewards:brevity"]')
    with pytest.raises(NotFoundError) as info:
        Scorer.from_config(cfg)
    assert "reward.verifiers" in info.value.message and "no_such_rewards" in info.value.message
    assert info.value.exit_code == EXIT_USAGE and "module path" in info.value.hint
    result = cli("serve", "reward", "--set", 'reward.verifiers=["no_such_rewards:brevity"]')
    assert result.exit_code == EXIT_USAGE and "no_such_rewards" in result.stderr


def test_a_class_or_a_constant_is_refused_as_a_reward_function(user_module):
    mod = user_module("odd_rewards", """
        class Brevity:
            pass
        LIMIT = 3
    """)
    for attr, what in (("Brevity", "a class"), ("LIMIT", "int")):
        with pytest.raises(NotFoundError, match=f"is {what}, not a function"):
            build_verifier(f"{mod}:{attr}", None)


def test_the_version_is_dunder_version_else_the_source_hash_and_enters_the_cache_key(user_module):
    one = user_module("rewards_one", "def score(req):\n    return 1.0\n")
    two = user_module("rewards_two", "def score(req):\n    return 1.0  # same result, other source\n")
    pinned = user_module("rewards_pinned", "def score(req):\n    return 1.0\nscore.__version__ = '2024.1'\n")
    versions = {m: build_verifier(f"{m}:score", None).version for m in (one, two, pinned)}
    assert versions[pinned] == "2024.1"
    assert versions[one].startswith("src-") and versions[two].startswith("src-") and versions[one] != versions[two]
    keys = {}
    for m in (one, two):
        s = Scorer(backoff_s=0.0)
        try:
            result = s.score(request({"verify": f"{m}:score"}))
        finally:
            s.close()
        assert result.verifier_versions[f"{m}:score"] == versions[m] and result.components["outcome"] == 1.0
        keys[m] = result.idempotency_key
    assert keys[one] != keys[two]


def test_a_callable_instance_is_a_reward_function(user_module):
    mod = user_module("stateful_rewards", """
        class Counter:
            __version__ = "3"
            def __call__(self, req):
                return 0.5
        count = Counter()
    """)
    verifier = build_verifier(f"{mod}:count", None)
    assert verifier.version == "3" and verifier.verify(request()).score == 0.5


def scored(fn, req: ScoreRequest | None = None, max_retries: int = 1):
    s = Scorer(backoff_s=0.0, max_retries=max_retries, weights={"outcome": 1.0, "fn:x": 0.5},
               components=[FunctionVerifier("fn:x", fn, "1")])
    try:
        return s.score(req or request()), s.counters
    finally:
        s.close()


@pytest.mark.parametrize("value, component", [(0.25, 0.25), (1, 1.0), (True, 1.0), (False, 0.0),
                                              (Verdict(0.75, ["style"], "neat"), 0.75)])
def test_a_number_or_a_verdict_is_a_score(value, component):
    result, _ = scored(lambda req: value)
    assert result.status == "ok" and result.components["fn:x"] == component
    assert result.reward == pytest.approx(1.0 + 0.5 * component)
    if isinstance(value, Verdict):
        assert "style" in result.flags and "fn:x: neat" in result.detail


def boom(req):
    raise RuntimeError("the grader fell over")


@pytest.mark.parametrize("fn, said", [(boom, "crashed: RuntimeError: the grader fell over"),
                                      (lambda req: 1.5, "outside [0, 1]"), (lambda req: -0.1, "outside [0, 1]"),
                                      (lambda req: math.nan, "outside [0, 1]"),
                                      (lambda req: None, "returned NoneType"), (lambda req: "1", "returned str"),
                                      (lambda req: {"score": 1.0}, "returned dict")])
def test_an_exception_a_score_outside_zero_one_or_another_return_is_infra_error_retried_and_counted(fn, said):
    result, counters = scored(fn, max_retries=2)
    assert result.status == "infra_error" and result.masked and result.reward == 0.0 and result.components == {}
    assert said in result.detail and "fn:x" in result.detail and result.attempts == 3
    assert counters["infra_errors"] == 1 and counters["verifier_retries"] == 3


def test_a_tampered_trajectory_scores_zero_without_calling_the_function():
    calls = []
    req = request(files=[{"path": "tests/test.sh", "content_b64": "ZXhpdCAw"}], protected={"tests/test.sh": "0" * 64})
    result, _ = scored(lambda r: calls.append(r) or 1.0, req)
    assert calls == [] and result.components["fn:x"] == 0.0 and "tamper" in result.flags and result.reward <= 0.0


def test_a_task_naming_a_function_that_cannot_be_imported_is_infra_error_naming_the_fix():
    s = Scorer(backoff_s=0.0)
    try:
        first = s.score(request({"verify": "no_such_rewards:score"}))
        again = s.score(request({"verify": "no_such_rewards:score"}))
    finally:
        s.close()
    assert first.status == "infra_error" and first.masked and not again.cached
    assert "task meta.verify" in first.detail and "no_such_rewards" in first.detail and "fix:" in first.detail



def test_a_component_runs_beside_the_outcome_verifier_not_after_it():
    started = threading.Event()

    class Waits:
        name, version = "answer", "w"

        def verify(self, req):  # finishes only once the component has started
            if not started.wait(10):
                raise VerifierError("the component never ran while the outcome verifier did")
            return Verdict(1.0)

    s = Scorer({"answer": Waits()}, backoff_s=0.0, max_retries=0,
               components=[FunctionVerifier("fn:x", lambda req: started.set() or 0.5, "1")])
    try:
        result = s.score(request())
    finally:
        s.close()
    assert result.status == "ok", result.detail
    assert (result.components["outcome"], result.components["fn:x"]) == (1.0, 0.5)
