"""Environments (harnesses) behind one versioned contract (`base.py`), found by name (`registry.py`)."""
