#!/usr/bin/env bash
# `make manifests-check`: the install manifests are what we say they are, with no cluster needed.
#  1. the CRD copies in the chart and in config/crd/bases are byte-identical to the generated crds/, and
#     the LICENSE copies in the chart and the Python SDK to LICENSE;
#  2. `helm lint --strict` of the chart with default values and with ci/full-values.yaml;
#  3. renders: helm template (default, full values), kubectl kustomize (config/default,
#     config/overlays/ha, config/overlays/namespaced, config/samples), written to
#     $ORCHARD_MANIFESTS_OUT (default: a temp dir);
#  4. kubeconform -strict on every render against the committed Kubernetes v1.36.3 schemas
#     (e2e/packaging-tools/schemas/, taken from the local test cluster's kube-apiserver) and schemas of
#     our CRDs generated from crds/*.yaml now;
#  5. observability (docs/OPERATIONS.md): the Grafana dashboard passes dashlint; the alerts of
#     config/prometheus/orchard-alerts.yaml, extracted from the PrometheusRule into a plain rule file,
#     pass `promtool check rules` and their unit tests (`promtool test rules`,
#     orchard-alerts.test.yaml); the chart's PrometheusRule (prometheusRule.enabled) has the same rules.
# helm, kubeconform and openapi2schema come from e2e/packaging-tools/build.sh, dashlint, promtool and
# promrule from e2e/tools/build.sh (built once, cached).
set -euo pipefail
cd "$(dirname "$0")/.."
tools=$(e2e/packaging-tools/build.sh | tail -n 1)
helm="$tools/helm"
kubeconform="$tools/kubeconform"
chart=charts/orchard-env
if [ -n "${ORCHARD_MANIFESTS_OUT:-}" ]; then
  out=$ORCHARD_MANIFESTS_OUT
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi

echo "--- CRD copies match crds/"
for crd in crds/*.yaml; do
  for copy in "$chart/files/crds/$(basename "$crd")" "config/crd/bases/$(basename "$crd")"; do
    if ! cmp -s "$crd" "$copy"; then
      echo "$copy differs from $crd: run 'make sync-crds'" >&2
      exit 1
    fi
  done
done
for copy in "$chart"/files/crds/*.yaml config/crd/bases/*.yaml; do
  [ -f "crds/$(basename "$copy")" ] || { echo "$copy has no source in crds/: run 'make sync-crds'" >&2; exit 1; }
done

echo "--- LICENSE copies match LICENSE"
# Helm and PEP 639 read no file outside the chart's or the SDK's directory: each ships a copy.
for copy in "$chart/LICENSE" sdk/python/LICENSE; do
  cmp -s LICENSE "$copy" || { echo "$copy differs from LICENSE: cp LICENSE $copy" >&2; exit 1; }
done

echo "--- helm lint"
"$helm" lint --strict "$chart"
"$helm" lint --strict "$chart" -f "$chart/ci/full-values.yaml"
"$helm" lint --strict "$chart" --set prometheusRule.enabled=true

echo "--- render"
"$helm" template orchard "$chart" --namespace orchard-system > "$out/helm-default.yaml"
"$helm" template orchard "$chart" --namespace orchard-system -f "$chart/ci/full-values.yaml" > "$out/helm-full.yaml"
"$helm" template orchard "$chart" --namespace orchard-system --set prometheusRule.enabled=true > "$out/helm-alerts.yaml"
kubectl kustomize config/default > "$out/kustomize-default.yaml"
kubectl kustomize config/overlays/ha > "$out/kustomize-ha.yaml"
kubectl kustomize config/overlays/namespaced > "$out/kustomize-namespaced.yaml"
kubectl kustomize config/samples > "$out/samples.yaml"
wc -l "$out"/*.yaml | sed 's/^/  /'

echo "--- kubeconform -strict (Kubernetes v1.36.3 + orchard.dev CRDs)"
crd_schemas="$out/schemas/crds"
"$tools/openapi2schema" crd -out "$crd_schemas" crds/*.yaml
# ServiceMonitor (ci/full-values.yaml) and PrometheusRule are prometheus-operator's kinds: no schema of
# them exists offline (the PrometheusRule's rules are checked by promtool below).
"$kubeconform" -strict -summary -skip ServiceMonitor,PrometheusRule \
  -schema-location "e2e/packaging-tools/schemas/kubernetes-v1.36.3/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
  -schema-location "$crd_schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
  "$out"/helm-default.yaml "$out"/helm-full.yaml "$out"/kustomize-default.yaml "$out"/kustomize-ha.yaml \
  "$out"/kustomize-namespaced.yaml \
  "$out"/samples.yaml "$out"/helm-alerts.yaml config/argocd/argocd-cm-patch.yaml

echo "--- observability: dashlint, promtool check rules / test rules, the chart's copy of the alerts"
obs=$(e2e/tools/build.sh dashlint promtool promrule | tail -n 1)
"$obs/dashlint" "$chart/dashboards/orchard-env.json"
rules="$out/rules"
mkdir -p "$rules"
"$obs/promrule" config/prometheus/orchard-alerts.yaml > "$rules/orchard-alerts.rules.yaml"
cp config/prometheus/orchard-alerts.test.yaml "$rules/"
"$obs/promtool" check rules "$rules/orchard-alerts.rules.yaml"
(cd "$rules" && "$obs/promtool" test rules orchard-alerts.test.yaml)
"$obs/promrule" "$out/helm-alerts.yaml" > "$rules/chart.rules.yaml"
if ! diff -u "$rules/orchard-alerts.rules.yaml" "$rules/chart.rules.yaml"; then
  echo "$chart/templates/prometheusrule.yaml has other rules than config/prometheus/orchard-alerts.yaml: copy the spec" >&2
  exit 1
fi
echo "manifests-check: ok"
