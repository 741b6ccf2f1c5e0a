"""The config's sections, one module each (`model.py` ... `verify.py`) on a common base (`base.py`);
`agentrl_cli/config/models.py` joins them into PlatformConfig and re-exports every name."""
