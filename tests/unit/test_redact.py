"""Secret redaction in text, rows and logs (docs/security.md row 29)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import uuid
from dataclasses import dataclass

import pytest

from agentrl_cli.config.models import DataConfig
from agentrl_cli.core.redact import Redactor, install_log_redaction, shannon_entropy
from agentrl_cli.runtime.data.schema import Artifact, StepRecord, ToolCallRecord, TrajectoryRecord

# Fake credentials, built so that the file itself does not look like it leaks any.
AWS_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SESSION_KEY_ID = "ASIA" + "Y34FZKBOKMUTVV7A"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
GH_BODY = "a1B2c3D4e5F6g7H8i9J0" + "k1L2m3N4o5P6q7R8"
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
       "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n-----END RSA PRIVATE KEY-----")
JWT = "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
RANDOM_TOKEN = "q8Zr3VnKx0PbW7tYc2LsHd9MfGj4Ue6A"  # 32 chars drawn at random from [A-Za-z0-9]


@pytest.fixture
def redactor() -> Redactor:
    return Redactor()


@pytest.mark.parametrize("secret, kind", [
    (AWS_KEY_ID, "aws_access_key"),
    (AWS_SESSION_KEY_ID, "aws_access_key"),
    ("ghp_" + GH_BODY, "github_token"),
    ("gho_" + GH_BODY, "github_token"),
    ("ghu_" + GH_BODY, "github_token"),
    ("ghs_" + GH_BODY, "github_token"),
    ("ghr_" + GH_BODY, "github_token"),
    ("github_pat_11ABCDEFG0" + "123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ", "github_token"),
    (PEM, "private_key"),
    (RANDOM_TOKEN, "high_entropy"),
])
def test_each_secret_kind_is_replaced_by_a_marker_naming_it(redactor, secret, kind):
    out = redactor.text(f"before {secret} after")
    assert secret not in out
    assert out == f"before [REDACTED:{kind}] after"


def test_aws_secret_key_after_a_label_is_redacted_and_the_label_kept(redactor):
    for text in (f"aws_secret_access_key = {AWS_SECRET}", f'"SecretAccessKey": "{AWS_SECRET}"',
                 f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}"):
        out = redactor.text(text)
        assert AWS_SECRET not in out and "[REDACTED:aws_secret_key]" in out
        assert out.lower().startswith(("aws_secret_access_key", '"secretaccesskey"'))


def test_pem_block_cut_off_before_its_end_line_is_still_redacted(redactor):
    truncated = PEM.split("-----END")[0]
    assert redactor.text("key:\n" + truncated) == "key:\n[REDACTED:private_key]"
    assert redactor.text(PEM + "\nnext line") == "[REDACTED:private_key]\nnext line"


@pytest.mark.parametrize("text, expected", [
    (f"curl -H 'Authorization: Bearer {JWT}' http://127.0.0.1/",
     "curl -H 'Authorization: Bearer [REDACTED:bearer_token]' http://127.0.0.1/"),
    (f"headers = {{'authorization': 'bearer {RANDOM_TOKEN}'}}",
     "headers = {'authorization': 'bearer [REDACTED:bearer_token]'}"),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic [REDACTED:authorization]"),
])
def test_bearer_and_authorization_credentials_are_redacted(redactor, text, expected):
    assert redactor.text(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("mysql -u root --password=hunter2", "mysql -u root --password=[REDACTED:password]"),
    ('{"api_key": "sk-abc"}', '{"api_key": "[REDACTED:api_key]"}'),
    ("db_password: 's3cret'", "db_password: '[REDACTED:password]'"),
    ("export GITHUB_TOKEN=abcd1234efgh", "export GITHUB_TOKEN=[REDACTED:token]"),
    ("X-Api-Key: 9f8e7d6c5b4aQWERTY", "X-Api-Key: [REDACTED:api_key]"),
])
def test_values_labelled_with_a_configured_field_name_are_redacted(redactor, text, expected):
    assert redactor.text(text) == expected


@pytest.mark.parametrize("text", [
    hashlib.sha256(b"artifact").hexdigest(),
    str(uuid.UUID(int=0x9C0FFEE5_1234_4ABC_8DEF_0123456789AB)),
    "9c0ffee512344abc8def0123456789ab",
    "The agent listed the directory, found three files and summarised them in one sentence.",
    "the bearer of bad news; bearer instruments; authorization: required for admin users",
    "def encode(token: str, max_tokens=100) -> list[int]:\n    tokens = tokenizer(token)\n    return tokens",
    "token: Optional[str] = None; password = getpass(); api_key=os.environ['KEY']",
    "fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token='<|pad|>')",
    "thisIsAVeryLongCamelCaseIdentifierName2 = AbstractSingletonProxyFactoryBeanImplementationV2Helper()",
    "/usr/lib/python3.11/site-packages/numpy/core/multiarray.py and botocore/data/s3/2006-03-01/endpoints-rule-set-1.json",
    "https://github.com/boto/botocore/blob/7a3d6a0e5fbc6bd25ca7d6c1b36aa3a4e7e2b0a1/botocore/utils.py#L282",
    "----------------------------------------  ================================",
])
def test_ordinary_text_code_digests_and_ids_are_left_untouched(redactor, text):
    assert redactor.text(text) == text


def test_redaction_is_idempotent(redactor):
    once = redactor.text(f"{AWS_KEY_ID} ghp_{GH_BODY} {PEM} Bearer {JWT} password=hunter2 {RANDOM_TOKEN}")
    assert redactor.text(once) == once
    assert once.count("[REDACTED:") == 6


def test_shannon_entropy_separates_random_tokens_from_repetitive_ones():
    assert shannon_entropy("") == 0.0
    assert shannon_entropy("aaaaaaaa") == 0.0
    assert shannon_entropy("abcd") == 2.0
    assert shannon_entropy(RANDOM_TOKEN) > 4.0


@dataclass
class _Row:
    note: str
    values: tuple


def test_value_recurses_through_dicts_lists_tuples_and_dataclasses(redactor):
    obj = {"outer": [f"key {AWS_KEY_ID}", (f"Bearer {JWT}", 3)], "row": _Row(note=f"ghp_{GH_BODY}", values=(PEM, 1.5))}
    out = redactor.value(obj)
    assert out["outer"] == ["key [REDACTED:aws_access_key]", ("Bearer [REDACTED:bearer_token]", 3)]
    assert isinstance(out["row"], _Row)
    assert out["row"] == _Row(note="[REDACTED:github_token]", values=("[REDACTED:private_key]", 1.5))
    assert obj["outer"][0] == f"key {AWS_KEY_ID}"  # the input is not modified


def test_value_replaces_every_string_under_a_secret_named_key_but_not_numbers(redactor):
    obj = {"DB_Password": "plainword", "headers": {"X-My-Api-Key": ["one", "two"]}, "token_count": 5,
           "token_ids": [1, 2, 3], "name": "plainword"}
    out = redactor.value(obj)
    assert out["DB_Password"] == "[REDACTED:password]"
    assert out["headers"]["X-My-Api-Key"] == ["[REDACTED:api_key]", "[REDACTED:api_key]"]
    assert out["token_count"] == 5 and out["token_ids"] == [1, 2, 3]
    assert out["name"] == "plainword"


def _record_with_secrets() -> TrajectoryRecord:
    digest = hashlib.sha256(b"out.txt").hexdigest()
    return TrajectoryRecord(
        run_id="run-1", task_id="task-7", harness="terminal_like", harness_version="1",
        initial_observation=f"env has AWS_ACCESS_KEY_ID={AWS_KEY_ID}",
        steps=[StepRecord(index=0, action=f"git clone https://x:ghp_{GH_BODY}@example.invalid/r.git",
                          observation=PEM,
                          tool_calls=[ToolCallRecord(name="http", arguments=json.dumps(
                              {"headers": {"Authorization": f"Bearer {JWT}"}, "api_key": "sk-1"}))])],
        artifacts=[Artifact(path="out.txt", sha256=digest, content=f"token {RANDOM_TOKEN}")],
        final_answer="done", token_ids=[101, 2023, 102], loss_mask=[0, 1, 1], logprobs=[-0.5, -1.25, -2.0],
        prompt_tokens=3, completion_tokens=2)


def test_row_redacts_nested_steps_tool_arguments_and_artifact_content(redactor):
    row = redactor.row(_record_with_secrets().to_row())
    text = repr(row)
    for secret in (AWS_KEY_ID, GH_BODY, "PRIVATE KEY", JWT, "sk-1", RANDOM_TOKEN):
        assert secret not in text
    assert row["initial_observation"] == "env has AWS_ACCESS_KEY_ID=[REDACTED:aws_access_key]"
    assert row["steps"][0]["observation"] == "[REDACTED:private_key]"
    assert '"api_key": "[REDACTED:api_key]"' in row["steps"][0]["tool_calls"][0]["arguments"]
    assert row["artifacts"][0]["content"] == "token [REDACTED:high_entropy]"


def test_row_keeps_ids_digests_and_numeric_columns_exactly(redactor):
    record = _record_with_secrets()
    original = record.to_row()
    row = redactor.row(original)
    for key in ("trajectory_id", "task_id", "run_id", "token_ids", "loss_mask", "logprobs", "prompt_tokens",
                "completion_tokens", "date", "harness", "started_at"):
        assert row[key] == original[key], key
    assert row["artifacts"][0]["sha256"] == original["artifacts"][0]["sha256"]
    assert original["steps"][0]["observation"] == PEM  # the input row is not modified


def test_row_ignores_the_key_name_rule_for_schema_columns(redactor):
    row = TrajectoryRecord(run_id="r", task_id="t", harness="h", harness_version="1", final_answer="plain").to_row()
    assert redactor.row(row)["final_answer"] == "plain"
    secretish = Redactor(field_names=["answer", "token"])
    assert secretish.row(row)["final_answer"] == "plain"


def test_from_config_uses_the_configured_field_names():
    redactor = Redactor.from_config(DataConfig(redact_fields=["session_cookie"]))
    assert redactor.value({"session_cookie": "abc", "password": "abc"}) == {"session_cookie": "[REDACTED:session_cookie]",
                                                                            "password": "abc"}


@pytest.fixture
def captured_logger():
    logger = logging.getLogger("agentrl.test.redact")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)
    logger.filters.clear()
    logger.propagate = True


def test_log_filter_redacts_the_formatted_message_and_its_args(captured_logger):
    logger, stream = captured_logger
    install_log_redaction(Redactor(), logger)
    logger.info("calling with key %s and header %r", AWS_KEY_ID, {"Authorization": f"Bearer {JWT}"})
    logger.warning(f"inline ghp_{GH_BODY}")
    out = stream.getvalue()
    assert AWS_KEY_ID not in out and JWT not in out and GH_BODY not in out
    assert "calling with key [REDACTED:aws_access_key] and header {'Authorization': 'Bearer [REDACTED:bearer_token]'}" in out
    assert "WARNING inline [REDACTED:github_token]" in out


def test_log_filter_redacts_exception_text(captured_logger):
    logger, stream = captured_logger
    install_log_redaction(Redactor(), logger)
    try:
        raise RuntimeError(f"login failed for {AWS_KEY_ID}")
    except RuntimeError:
        logger.exception("request failed")
    out = stream.getvalue()
    assert "RuntimeError: login failed for [REDACTED:aws_access_key]" in out
    assert AWS_KEY_ID not in out


def test_installed_filter_also_covers_records_propagated_from_child_loggers(captured_logger):
    logger, stream = captured_logger
    install_log_redaction(Redactor(), logger)
    logging.getLogger("agentrl.test.redact.child").info("child saw %s", PEM)
    assert stream.getvalue().strip() == "INFO child saw [REDACTED:private_key]"


def test_the_arrow_table_path_redacts_exactly_like_the_row_path():
    from agentrl_cli.runtime.data.schema import Artifact, StepRecord, ToolCallRecord, TrajectoryRecord, to_table

    secret_text = "key " + "AKIA" + "Q7XK2M4PZ8RT5WBN" + " and " + "ghp_" + "x7Kq2Lm9Pz4Rt6Wb8Nc1Vd3Fg5Hj0Ks2Qe4Ty"
    rec = TrajectoryRecord(
        run_id="r", task_id="t", harness="h", harness_version="1", initial_observation=secret_text,
        final_answer="Bearer " + "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXBheWxvYWQ.Zm9vYmFy",
        steps=[StepRecord(0, "echo hi", "hi"),
               StepRecord(1, "env", secret_text, tool_calls=[ToolCallRecord("run", '{"password": "hunter2hunter2"}')])],
        artifacts=[Artifact("a.txt", "ab" * 32, secret_text)])
    clean = TrajectoryRecord(run_id="r", task_id="t2", harness="h", harness_version="1", steps=[StepRecord(0, "ls", "a b c")])
    rows = [rec.to_row(), clean.to_row()]
    r = Redactor()
    by_table = r.table(to_table(rows)).to_pylist()
    by_row = to_table([r.row(x) for x in rows]).to_pylist()
    assert by_table == by_row
    assert "AKIA" not in str(by_table) and "ghp_" not in str(by_table) and "hunter2" not in str(by_table)
    assert by_table[0]["artifacts"][0]["sha256"] == "ab" * 32
    assert by_table[1] == to_table([rows[1]]).to_pylist()[0]  # clean rows untouched
