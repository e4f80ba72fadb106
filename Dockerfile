# The agent image the Helm chart runs (values: image.repository / image.tag).
# Built with `docker build -t gpuguard:0.1.0 .`; NVML comes from the host driver through
# the NVIDIA container runtime, so the image carries no CUDA or driver libraries. It runs
# as root: reading /dev/kmsg needs a privileged container (see the chart README).
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir . && rm -rf /src
WORKDIR /
ENTRYPOINT []
CMD ["gpuguard", "agent"]
