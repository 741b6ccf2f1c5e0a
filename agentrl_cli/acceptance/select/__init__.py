"""`agentrl select`: seed 003 §四's eight framework-selection criteria, each run as a probe against
each installed training backend on this machine, joined into one scorecard
(`runs/<run_id>/reports/select.{json,md}` and a section of the run's HTML report).

Modules: `scorecard.py` (the criteria, the result model, the exit code, the JSON and Markdown),
`probes.py` (which probe measures which criterion, per backend), `loop_probe.py` (a short real
training loop per backend, and the embedded server's abort and partial resume), `stress.py` and
`stress_worker.py` (the ZeRO/FSDP memory and step-time table), `checkpoint_probe.py` (own resume,
the kept fixtures of earlier versions, the other backend's checkpoint), `packages.py` (dependencies,
licences and maintenance from the image lock and installed metadata).
"""
