# The image the Helm chart runs (values: image.repository / image.tag): `make image`
# builds it with buildah, or `docker build -t gpuguard/gpuguard:0.1.0 .`. NVML comes from
# the host driver through the NVIDIA container runtime, so the image carries no CUDA or
# driver libraries.
#
# Dependencies come from deploy/image/requirements.lock, every file checked against its
# hash (pyproject.toml stays the source; the lock's header is the command that
# regenerates it after a dependency change there).
#
# The default user is unprivileged (65532, as the controller runs). The agent reads
# /dev/kmsg, which needs a privileged container running as root: the chart's agent
# securityContext says so (see deploy/helm/gpuguard/README.md, "Why privileged").
FROM python:3.11-slim
COPY deploy/image/requirements.lock /tmp/requirements.lock
RUN pip install --no-cache-dir --require-hashes --only-binary=:all: \
      -r /tmp/requirements.lock \
 && rm /tmp/requirements.lock
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# --no-deps --no-build-isolation: everything, setuptools included, came from the lock.
RUN pip install --no-cache-dir --no-deps --no-build-isolation . \
 && rm -rf /src \
 && groupadd --system --gid 65532 gpuguard \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpuguard
WORKDIR /
USER 65532:65532
CMD ["gpuguard", "agent"]
