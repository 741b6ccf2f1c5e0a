"""The names of a run's metrics, defined once: the keys of the rows of `metrics.jsonl` that the
training loop writes and the run's readers (the HTML report, verify, troubleshoot) read.

Keys are namespaced as CleanRL's are: `train/…` (the learner's losses and diagnostics; its
`train_step` returns them unprefixed), `reward/…` (the batch's rewards), `time/…` (the phase times of
a step and their shares), `sync/…` (weight sync), `rollout/…` (counters of the rollout and the
buffer), `infer/…` (generation totals, and `infer/<harness>/…`), `env/<harness>/…` (service levels),
`gateway/…` (the run's recording gateway, when an agent harness starts one),
`eval/<harness>/…` (one row per evaluation), `system/…` (CPU, RSS, accelerators), `watchdog/…`,
`supervisor/…` (restarts and outages of the run's components), `observe/…` (the run's own trackers).
A name with a harness (or a tool, an error, a status) in it is built by a function here.

Belongs here: names. Computing a figure belongs to the part that owns it; writing a row is
`step_metrics.py`'s.
"""

from __future__ import annotations

STEP, VERSION, ELAPSED_S = "step", "version", "elapsed_s"

TRAIN_LOSS = "train/loss"
TRAIN_GRAD_NORM = "train/grad_norm"
TRAIN_ENTROPY = "train/entropy"
TRAIN_ENTROPY_COEF = "train/entropy_coef"  # the entropy bonus the step trained with (moves under training.entropy_target)
TRAIN_LR = "train/lr"
TRAIN_KL_REF = "train/kl_ref"
TRAIN_MISMATCH_KL = "train/mismatch_kl"
TRAIN_SAMPLES = "train/samples"  # samples the step trained on
TRAIN_SEQUENCE_TOKENS = "train/sequence_tokens"  # tokens of the step's samples, each sequence whole
# the train step's phases (learner/step_clock.py), seconds summed over its micro-batches
TRAIN_FORWARD_S, TRAIN_BACKWARD_S, TRAIN_OPTIMIZER_S = "train/forward_s", "train/backward_s", "train/optimizer_s"
# off-policy correction (training.correction other than none; learner/corrections.py): over the step's tokens,
# or sequences for seq_tis / seq_mis, rho = pi_old / pi_rollout
TRAIN_IS_WEIGHT_MEAN = "train/is_weight_mean"  # mean of rho, before truncation or rejection
TRAIN_IS_WEIGHT_MAX = "train/is_weight_max"
TRAIN_IS_WEIGHT_P99 = "train/is_weight_p99"  # nearest-rank 99th percentile of rho
TRAIN_IS_ESS = "train/is_ess"  # effective sample size of the weights applied, over n: 1 = all weigh the same
TRAIN_IS_REJECTED_FRACTION = "train/is_rejected_fraction"  # units dropped from the loss (mis, seq_mis, decoupled)
TRAIN_POLICY_LAG = "train/policy_lag"  # token-weighted mean staleness, when the step's samples carry it
TRAIN_CORRECTION = (TRAIN_IS_WEIGHT_MEAN, TRAIN_IS_WEIGHT_MAX, TRAIN_IS_WEIGHT_P99, TRAIN_IS_ESS, TRAIN_IS_REJECTED_FRACTION)


def train_name(key: str) -> str:
    """The name the learner's `train_step` returns for the row key `train/<name>` (the run adds the prefix)."""
    return key.removeprefix("train/")


REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
REWARD_SUCCESS_RATE = "reward/success_rate"
REWARD_MASKED = "reward/masked"  # episodes of the batch not scored (infra_error), masked from training
REWARD_ROLE_PATTERN = r"^reward/role/([^/]+)/(mean|success_rate|episodes)$"  # groups: role, figure


def reward_role(role: str, figure: str = "mean") -> str:
    """`reward/role/<role>/<figure>` (mean, success_rate, episodes): the batch's rewards of one role of
    a multi-agent harness (its episodes' records carry the role); absent from batches without roles."""
    return f"reward/role/{role}/{figure}"

TIME_SAMPLING_WAIT_S = "time/sampling_wait_s"  # the trainer waiting for a batch
TIME_TRAIN_S = "time/train_s"
TIME_SYNC_S = "time/sync_s"
PHASE_TIMES = {"sampling": TIME_SAMPLING_WAIT_S, "training": TIME_TRAIN_S, "sync": TIME_SYNC_S}  # the three timed phases


def time_part(part: str) -> str:
    """`time/<part>` of a step's breakdown (`run/loop/steps.py`): on the trainer's path wait_s, train_s,
    sync_s, checkpoint_s, other_s, step_s; beside it generate_s, reward_s, store_s, env_s."""
    return f"time/{part}"


def time_share(part: str) -> str:
    """`time/<part>_share`, part one of sampling, train, sync: the part's share of the step."""
    return f"time/{part}_share"


SYNC_SECONDS = "sync/seconds"
SYNC_WEIGHT_VERSION = "sync/weight_version"

ROLLOUT_TOKENS_GENERATED = "rollout/tokens_generated"
ROLLOUT_IN_FLIGHT = "rollout/in_flight"
ROLLOUT_BUFFER_FILL = "rollout/buffer_fill"
ROLLOUT_BUFFER_CAPACITY = "rollout/buffer_capacity"
ROLLOUT_QUEUE_LENGTH = "rollout/queue_length"  # in flight + buffered
ROLLOUT_DROPPED_STALE = "rollout/dropped_stale"  # cumulative
ROLLOUT_STALENESS_MEAN = "rollout/staleness_mean"  # mean policy lag of the trained episodes
ROLLOUT_BACKPRESSURE_WAITS = "rollout/backpressure_waits"
ROLLOUT_ENV_FAILURES = "rollout/env_failures"  # episodes ended by an environment error or timeout
ROLLOUT_EPISODE_ERRORS = "rollout/episode_errors"  # episodes that failed to start or run
ROLLOUT_INFRA_ERRORS = "rollout/infra_errors"
ROLLOUT_GOODPUT = "rollout/goodput"  # trained tokens / generated tokens
ROLLOUT_EPISODES_STEP = "rollout/episodes_step"  # episodes finished since the last step
TOKENS_TRAINED = "tokens/trained"  # tokens of the step's trained episodes
ROLLOUT_EPISODES_TRAINED = "rollout/episodes_trained"  # the step's episodes trained on (not masked)
ROLLOUT_SAMPLES_BUILT = "rollout/samples_built"  # their samples: more than episodes when some train per segment
# dynamic sampling (rollout.dynamic_sampling; run/loop/shaping.py), in the rows of runs that turn it on
ROLLOUT_DROPPED_FLAT_GROUPS = "rollout/dropped_flat_groups"  # the step's groups dropped: all rewards equal, no signal
ROLLOUT_REFILL_ROUNDS = "rollout/refill_rounds"  # the step's rounds of taking more groups to replace them
ROLLOUT_SKIPPED_STEPS = "rollout/skipped_steps"  # cumulative: steps left with no group with signal, not trained
# per-turn credit (training.advantage: turn; learner/turn_credit.py), in the rows of runs that turn it on
ADVANTAGE_TURN_SPREAD = "rollout/turn_advantage_spread"  # mean over the step's trained episodes of the std of their turn advantages
ADVANTAGE_STEP_SHARE = "rollout/step_advantage_share"  # sum|A_step| / (sum|A_step| + sum|A_outcome|) over their turns
ROLLOUT_TURN_UNMAPPED = "rollout/turn_unmapped"  # trained episodes whose turns could not be located in their tokens (outcome advantage only)
ROLLOUT_OVERLONG_FILTERED = "rollout/overlong_filtered"  # the step's episodes cut at the length limit, out of the loss
ROLLOUT_COUNTERS = ("aborted_generations", "resumed_generations", "wasted_tokens", "server_retries", "weight_resyncs")


def gateway(counter: str) -> str:
    """`gateway/<counter>`: a counter of the run's recording gateway (agentrl_cli/engines/gateway/service.py
    GATEWAY_COUNTERS: calls, non_prefix_calls, refused_calls, ...), in the rows of runs that start one."""
    return f"gateway/{counter}"


GATEWAY_MALFORMED_TOOL_CALLS = "gateway/malformed_tool_calls"  # tool calls the model wrote that the parser refused


def gateway_malformed_tool_calls(h: str) -> str:
    """`gateway/<harness>/malformed_tool_calls`: of those, the ones in the sessions of harness `h` (cumulative)."""
    return f"gateway/{h}/malformed_tool_calls"


GATEWAY_MALFORMED_PATTERN = r"^gateway/([^/]+)/malformed_tool_calls$"  # group: harness


def rollout(counter: str) -> str:
    """`rollout/<counter>`: a counter of the rollout controller (ROLLOUT_COUNTERS)."""
    return f"rollout/{counter}"


# trainer restarts (training.max_restarts; run/loop/restarts.py): a cumulative count in every step row, and one
# row per restart (EVENT = TRAINER_RESTART) with its cause, the last step it completed and the checkpoint it resumed
TRAINER_RESTARTS = "run/trainer_restarts"
EVENT = "event"  # what a row that is not a step's or an evaluation's records
TRAINER_RESTART = "trainer_restart"
RESTART_CAUSE = "restart/cause"  # rank_died, out_of_memory, hang, error
RESTART_ERROR = "restart/error"  # the crash's message, cut to its first lines
RESTART_LAST_STEP = "restart/last_step"  # the last step the crashed trainer completed
RESTART_FROM = "restart/from_checkpoint"  # the checkpoint the run restarts from (null: from the start)

# the run's supervisor (agentrl_cli/run/supervise/): cumulative restarts of the components it started, times a
# component went down, and the components down now (restarting, given up, or not answering its health check)
SUPERVISOR_RESTARTS = "supervisor/restarts"
SUPERVISOR_DOWN = "supervisor/down"
SUPERVISOR_DOWN_NOW = "supervisor/down_now"
SUPERVISOR_SERVERS = "supervisor/servers"  # inference servers in the rollout's rotation now


def supervisor(counter: str) -> str:
    """`supervisor/<counter>`: a counter of the run's supervisor (SUPERVISOR_*), in the rows of supervised runs."""
    return f"supervisor/{counter}"


def tracker_errors(tracker: str) -> str:
    """`observe/tracker_errors/<tracker>`: rows a tracker (observe.trackers) failed to take so far, in the rows once non-zero."""
    return f"observe/tracker_errors/{tracker}"


INFER_GENERATE_S_TOTAL = "infer/generate_s_total"
INFER_ENV_S_TOTAL = "infer/env_s_total"
WATCHDOG_STUCK_NOW = "watchdog/stuck_now"

SYSTEM_CPU_PERCENT = "system/cpu_percent"
SYSTEM_RSS_MB = "system/rss_mb"
SYSTEM_CHILDREN_RSS_MB = "system/children_rss_mb"

EVAL = "eval/"
EVAL_SUCCESS_RATE = "success_rate"
EVAL_EPISODES = "episodes"


def eval_success_rate(h: str) -> str:
    """`eval/<harness>/success_rate`: the harness's greedy success in an evaluation row."""
    return f"eval/{h}/success_rate"


def eval_episodes(h: str) -> str:
    """`eval/<harness>/episodes`: how many episodes that success rate is over."""
    return f"eval/{h}/episodes"


def eval_harness(key: str, figure: str = EVAL_SUCCESS_RATE) -> str | None:
    """The harness of an `eval/<harness>/<figure>` key, else None."""
    parts = key.split("/")
    return parts[1] if len(parts) == 3 and parts[0] == "eval" and parts[2] == figure else None


def is_eval_row(row: dict) -> bool:
    """An evaluation's row (it carries `eval/…` keys), not a trainer step's."""
    return any(k.startswith(EVAL) for k in row)


def is_step_row(row: dict) -> bool:
    """A trainer step's row: it carries the step's loss."""
    return TRAIN_LOSS in row


def env_tool(h: str, tool: str, status: str) -> str:
    """`env/<harness>/tool/<tool>/<status>`: tool calls so far with that status (cumulative)."""
    return f"env/{h}/tool/{tool}/{status}"


def env_create_failures(h: str, error: str) -> str:
    """`env/<harness>/create_failures/<error>`: environment creations that failed with `error`."""
    return f"env/{h}/create_failures/{error}"


def env_harness_errors(h: str, method: str) -> str:
    """`env/<harness>/harness_errors/<method>`: episodes the harness's own `method` failed (masked)."""
    return f"env/{h}/harness_errors/{method}"


def env_backpressure(h: str) -> str:
    """`env/<harness>/backpressure`: sessions its environment's server refused at capacity, waited out (not errors)."""
    return f"env/{h}/backpressure"


def env_capacity(h: str) -> str:
    """`env/<harness>/capacity`: the sessions its environment's server said it holds (learnt from a refusal)."""
    return f"env/{h}/capacity"


MIB = 1024 * 1024
ENV_RESOURCE_FIGURES = ("cpu_s_mean", "cpu_s_max", "peak_mem_mb_max", "peak_mem_mb_p99", "processes_max", "open_files_max")


def env_resource(h: str, figure: str) -> str:
    """`env/<harness>/<figure>`, figure one of ENV_RESOURCE_FIGURES: what the harness's sandboxes used
    per episode (CPU seconds, peak memory in MiB, processes, open files), over the episodes ended
    since the previous row (runtime/observe/harness_stats.py); absent from rows with none."""
    return f"env/{h}/{figure}"


ENV_TOOL_PATTERN = r"^env/([^/]+)/tool/(.+)/([^/]+)$"  # groups: harness, tool, status
ENV_CREATE_FAILURES_PATTERN = r"^env/([^/]+)/create_failures/(.+)$"  # groups: harness, error
ENV_HARNESS_ERRORS_PATTERN = r"^env/([^/]+)/harness_errors/(.+)$"  # groups: harness, method
LEVEL_NAMESPACES = ("env", "infer", "gateway")  # `<ns>/<harness>/<figure>`: per-harness service levels


def system_gpu(gpu: str, figure: str) -> str:
    """`system/<gpu>/<figure>`, gpu as `gpu0`."""
    return f"system/{gpu}/{figure}"
