"""Adapters: environments the ecosystem already has, presented as harnesses (`harnesses.base`).
One module per source, each registered by name in the `agentrl.harnesses` entry-point group:
`openenv` (an OpenEnv server, by URL or started on loopback), `reasoning_gym` (its generated tasks,
scored by its own `score_answer`), `harbor` (Harbor task directories graded by their `tests/` in a
fresh bubblewrap sandbox), `verifiers` (a verifiers v1 taskset scored by its own rubric). Nothing in training knows an episode came through one."""
