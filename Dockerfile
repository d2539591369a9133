# The image `kerastrain export k8s` names by default (kerastrain:VERSION):
#   docker build -t kerastrain:0.1.0 .        (then push it where your cluster pulls from,
#                                             and pass --image REGISTRY/kerastrain:0.1.0)
# Every task of an exported job runs `kerastrain run recipes/NAME.yaml` from /kerastrain, so
# the shipped recipes (and your own, copied beside them) are found at the paths given.
FROM python:3.11-slim
WORKDIR /kerastrain
COPY pyproject.toml README.md ./
COPY kerastrain ./kerastrain
COPY recipes ./recipes
RUN pip install --no-cache-dir . && kerastrain --version
ENV PYTHONUNBUFFERED=1
CMD ["kerastrain", "--help"]
