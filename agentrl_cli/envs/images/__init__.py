"""Images sandboxes run in: a reference (`reference.py`), an OCI layout read with every digest
verified (`oci.py`), layers unpacked with whiteouts, hard links and no escapes (`unpack.py`) into a
content-addressed cache (`cache.py`). What runs inside an image belongs to `envs/sandbox/`; pulling
from a registry belongs nowhere (none is reachable here: an image arrives as an OCI layout or archive)."""

from agentrl_cli.envs.images.cache import DEFAULT_CACHE_DIR, RootFS, cached, cached_digests, digest_of, resolve
from agentrl_cli.envs.images.reference import ImageError, ImageRef, parse

__all__ = ["DEFAULT_CACHE_DIR", "ImageError", "ImageRef", "RootFS", "cached", "cached_digests", "digest_of", "parse", "resolve"]
