"""Image and runtime: the lock of exact versions and licences per role (`lock.py`), Dockerfiles
rendered from `templates/docker/` (`render.py`), the running environment checked against the lock
(`acceptance/verify.py`), and building with docker, podman or buildah where one works (`build.py`)."""
