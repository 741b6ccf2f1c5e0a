"""Who may call the platform's services, and the record of what they did.

Belongs here: bearer keys (where a service's keys come from, two valid at once for rotation, key
ids), the HTTP guard every service mounts (`http.BearerAuth`), and the audit log (`audit.AuditLog`).
Not here: keeping secrets out of logs and reports (`core/redaction.py`), the secrets' config
keys (`config/models.py`), or how pods receive them (`ops/controlplane/manifests.py`).
"""

from agentrl_cli.core.security.audit import AuditLog
from agentrl_cli.core.security.http import OPEN_PATHS, WEIGHT_UPDATE_PATHS, BearerAuth, bearer_token
from agentrl_cli.core.security.keys import KeyRing, client_key, key_id, service_keys

__all__ = ["AuditLog", "BearerAuth", "KeyRing", "OPEN_PATHS", "WEIGHT_UPDATE_PATHS", "bearer_token", "client_key",
           "key_id", "service_keys"]
