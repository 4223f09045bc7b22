#!/usr/bin/env bash
# Offline validation of everything under deploy/ and k8s/, for CI and before every release.
#
#   bash deploy/validate.sh            # exits non-zero on any problem
#
# 1. renders k8s/overlays/{cpu,gpu,s3,redis-sentinel,redis-cluster}, the bulk Job k8s/bulk and the
#    optional k8s/monitoring with `kubectl kustomize` or `kustomize` when installed, else with
#    deploy/render_kustomize.py (and, when both exist, checks they agree);
# 2. validates every rendered object (k8s/bulk's too, and k8s/tools/*.yaml) against the Kubernetes
#    schemas of $K8S_VERSION (default 1.32.0), strictly: unknown fields are errors (k8s/monitoring holds a
#    Prometheus Operator ServiceMonitor, a custom resource outside those schemas: rendered only);
# 3. runs checkov's Kubernetes policies on the same objects. Rendered output rather than
#    `checkov -d k8s`, because base files carry no namespace and overlays hold partial patches;
#    a skipped check needs a written reason in a `checkov.io/skipN` annotation (annotations,
#    unlike comments, survive rendering) and is counted in the report;
# 4. lints the Dockerfiles with hadolint;
# 5. checks the compose files (`docker compose config` when available, plus invariants).
#
# The validators live in their own virtualenv (deploy/requirements-validate.txt), created on
# first use at $DEPLOY_TOOLS_VENV: checkov's pins would downgrade packages the service uses.
# Nothing here contacts a cluster or a registry; only that first install uses the package index.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

K8S_VERSION="${K8S_VERSION:-1.32.0}"
OVERLAYS=(cpu gpu s3 redis-sentinel redis-cluster)
# Applied beside an overlay where the cluster has what they need; rendered and compared only.
OPTIONAL=(monitoring)
# Applied by hand beside an overlay (k8s/bulk: an Indexed Job scoring a dataset's shards); validated
# and checked like the overlays.
EXTRA=(bulk)
TOOLS_VENV="${DEPLOY_TOOLS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/clip-deploy-tools}"
REQUIREMENTS="deploy/requirements-validate.txt"

if [[ -x .venv/bin/python ]]; then PYTHON="${PYTHON:-.venv/bin/python}"; else PYTHON="${PYTHON:-python3}"; fi

failures=()
step() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; failures+=("$*"); }

# A tool from PATH, else from the tools virtualenv (installed there on first use).
tool() {
    local name="$1"
    if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return 0; fi
    if [[ ! -x "$TOOLS_VENV/bin/$name" ]]; then
        echo "installing validators into $TOOLS_VENV" >&2
        { python3 -m venv "$TOOLS_VENV" && "$TOOLS_VENV/bin/pip" install --quiet -r "$REQUIREMENTS"; } >&2 || return 1
    fi
    [[ -x "$TOOLS_VENV/bin/$name" ]] && echo "$TOOLS_VENV/bin/$name"
}

OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

# ---------------------------------------------------------------- 1. render
step "render overlays"
if command -v kubectl >/dev/null 2>&1; then
    RENDERER=(kubectl kustomize)
elif command -v kustomize >/dev/null 2>&1; then
    RENDERER=(kustomize build)
else
    RENDERER=()
fi
for overlay in "${OVERLAYS[@]}" "${OPTIONAL[@]}" "${EXTRA[@]}"; do
    dir="k8s/overlays/$overlay"
    if [[ " ${OPTIONAL[*]} ${EXTRA[*]} " == *" $overlay "* ]]; then dir="k8s/$overlay"; fi
    if ((${#RENDERER[@]})); then
        if "${RENDERER[@]}" "$dir" >"$OUT/$overlay.yaml"; then
            echo "$dir: rendered with ${RENDERER[*]}"
            # Keeps the fallback renderer honest: CI machines without kustomize use it.
            "$PYTHON" deploy/render_kustomize.py "$dir" --compare "$OUT/$overlay.yaml" \
                || fail "deploy/render_kustomize.py disagrees with ${RENDERER[*]} on $dir"
        else
            fail "${RENDERER[*]} $dir"
        fi
    else
        "$PYTHON" deploy/render_kustomize.py "$dir" -o "$OUT/$overlay.yaml" \
            && echo "$dir: rendered with deploy/render_kustomize.py" \
            || fail "render $dir"
    fi
done
RENDERED=()
for overlay in "${OVERLAYS[@]}" "${EXTRA[@]}"; do
    [[ -s "$OUT/$overlay.yaml" ]] && RENDERED+=("$OUT/$overlay.yaml")
done
((${#RENDERED[@]} == ${#OVERLAYS[@]} + ${#EXTRA[@]})) || fail "not every overlay rendered"
# Stand-alone manifests (applied by hand, outside any kustomization) are checked as they are.
TOOLS=(k8s/tools/*.yaml)

# ---------------------------------------------------------------- 2. schemas
step "kubernetes-validate --strict (Kubernetes $K8S_VERSION)"
if KV="$(tool kubernetes-validate)"; then
    "$KV" --strict --quiet --kubernetes-version "$K8S_VERSION" "${RENDERED[@]}" "${TOOLS[@]}" \
        && echo "all objects valid" || fail "kubernetes-validate"
else
    fail "kubernetes-validate is not available"
fi

# ---------------------------------------------------------------- 3. policies
step "checkov (kubernetes framework: rendered overlays + k8s/tools)"
if CHECKOV="$(tool checkov)"; then
    checkov_args=(--framework kubernetes --compact --quiet --skip-download)
    # One run over everything, so graph checks (every pod covered by a NetworkPolicy) see the
    # namespace's policies when judging the stand-alone manifests too.
    for file in "${RENDERED[@]}" "${TOOLS[@]}"; do checkov_args+=(--file "$file"); done
    # --skip-download: no calls home for guidelines; the policies ship with the package.
    "$CHECKOV" "${checkov_args[@]}" || fail "checkov"
else
    fail "checkov is not available"
fi

# ---------------------------------------------------------------- 4. Dockerfiles
step "hadolint"
if HADOLINT="$(tool hadolint)"; then
    "$HADOLINT" deploy/Dockerfile deploy/Dockerfile.train deploy/Dockerfile.bulk && echo "Dockerfiles clean" || fail "hadolint"
else
    fail "hadolint is not available"
fi

# ---------------------------------------------------------------- 5. compose
step "compose"
COMPOSE=()
if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    COMPOSE=(docker-compose)
fi
if ((${#COMPOSE[@]})); then
    "${COMPOSE[@]}" -f deploy/compose.yaml --profile train config -q \
        && VARIANT=cuda "${COMPOSE[@]}" -f deploy/compose.yaml -f deploy/compose.gpu.yaml --profile train config -q \
        && echo "compose files valid (${COMPOSE[*]})" || fail "${COMPOSE[*]} config"
else
    echo "no compose binary: schema check skipped, invariants still checked"
fi
"$PYTHON" deploy/check_compose.py deploy/compose.yaml && echo "compose invariants hold" || fail "compose invariants"

# ---------------------------------------------------------------- summary
echo
if ((${#failures[@]})); then
    printf 'deploy validation FAILED (%d):\n' "${#failures[@]}" >&2
    printf '  - %s\n' "${failures[@]}" >&2
    exit 1
fi
echo "deploy validation passed"
