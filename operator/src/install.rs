//! The operator's install, from one source: the namespace, its
//! ServiceAccount and RBAC, the Deployment, the metrics Service, the roles
//! users get and the admission policies. Written twice by `manifestgen`:
//! as `manifests/install.yaml` (the CRDs first, every value at its
//! default) and as the Helm chart's templates (the same objects, with
//! Helm expressions where values go), so the two cannot drift; a test
//! fails when either committed copy is stale.

use serde_json::{Value, json};

use crate::admission;

/// The namespace install.yaml installs into (the chart: the release's).
pub const NAMESPACE: &str = "wirerate-system";
/// The operator's name: ServiceAccount, ClusterRole, Deployment.
pub const NAME: &str = "wirerate-operator";
/// The operator's image, without tag.
pub const IMAGE: &str = "ghcr.io/wirerate/wirerate-operator";
/// The version the manifests pin (the workspace's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Where /metrics, /healthz and /readyz listen.
pub const METRICS_PORT: i32 = 8080;
/// Two replicas are safe: only the holder of the leader Lease reconciles.
pub const REPLICAS: i32 = 2;
/// The operator's flag (without `--`) for the host directories pools may
/// mount; the binary's clap attribute names it through this, so the chart
/// cannot pass a flag the operator does not take.
pub const ALLOWED_HOST_PATHS_FLAG: &str = "allowed-host-paths";

/// Which output is being built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// manifests/install.yaml: values filled in.
    Install,
    /// The chart's templates: Helm expressions, put in by `helmify`.
    Chart,
}

/// The chart's values, with their defaults: values.yaml is written from
/// this, and install.yaml takes the same defaults.
pub fn values() -> Value {
    json!({
        "image": {"repository": IMAGE, "tag": "", "pullPolicy": "IfNotPresent"},
        "replicas": REPLICAS,
        "metricsPort": METRICS_PORT,
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        },
        "nodeSelector": {},
        "tolerations": [],
        "podSecurityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "serviceMonitor": {"enabled": false, "interval": "30s", "labels": {}},
        "grafanaDashboard": {"enabled": true, "labels": {"grafana_dashboard": "1"}},
        "allowedHostPaths": [],
    })
}

/// A value: its default for install.yaml, a placeholder `helmify` turns
/// into a Helm expression for the chart.
fn knob(t: Target, placeholder: &str, default: Value) -> Value {
    match t {
        Target::Install => default,
        Target::Chart => Value::String(format!("@@{placeholder}@@")),
    }
}

fn namespace(t: Target) -> Value {
    knob(t, "namespace", json!(NAMESPACE))
}

/// Labels of every object; the chart adds Helm's own.
fn labels(t: Target) -> Value {
    match t {
        Target::Install => json!({
            "app.kubernetes.io/name": NAME,
            "app.kubernetes.io/part-of": "wirerate",
            "app.kubernetes.io/version": VERSION,
        }),
        Target::Chart => json!({"@@include:wirerate.labels@@": ""}),
    }
}

fn selector() -> Value {
    json!({"app.kubernetes.io/name": NAME})
}

/// The operator's cluster-wide rights: what it reads, writes, and the
/// rights it grants the agents (it holds each one it grants).
fn cluster_role_rules() -> Value {
    json!([
        {"apiGroups": ["wirerate.io"], "resources": ["dtnpools", "transfers"], "verbs": ["get", "list", "watch", "patch", "update"]},
        {"apiGroups": ["wirerate.io"], "resources": ["dtnpoolbindings"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["wirerate.io"], "resources": ["dtnpools/status", "transfers/status"], "verbs": ["get", "patch", "update"]},
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get", "list", "watch", "create", "patch"]},
        {"apiGroups": [""], "resources": ["services", "serviceaccounts"], "verbs": ["get", "create", "patch"]},
        // The agents' Roles, listed by label to revoke what a pool may no longer reach.
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": ["get", "list", "create", "patch", "delete"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch", "create", "update", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        // To say, at start and on every look, whether its admission policies are there.
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]},
        // list: a StatefulSet's FailedCreate Events explain a pool without agents.
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "list"]},
    ])
}

/// What people get in their namespaces through the built-in view, edit and
/// admin ClusterRoles (aggregation): scientists with `edit` create
/// Transfers; only namespace admins create DtnPools and DtnPoolBindings,
/// which give agents rights in the namespace (the admission policies check
/// that the author holds them).
fn user_roles(t: Target) -> Vec<Value> {
    let role = |name: &str, levels: &[&str], rules: Value| {
        let mut l = labels(t);
        for level in levels {
            l[format!("rbac.authorization.k8s.io/aggregate-to-{level}")] = json!("true");
        }
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": l},
            "rules": rules,
        })
    };
    vec![
        role(
            "wirerate-view",
            &["view", "edit", "admin"],
            json!([{"apiGroups": ["wirerate.io"], "resources": ["dtnpools", "dtnpools/status", "transfers", "transfers/status", "dtnpoolbindings"], "verbs": ["get", "list", "watch"]}]),
        ),
        role(
            "wirerate-edit",
            &["edit", "admin"],
            json!([{"apiGroups": ["wirerate.io"], "resources": ["transfers"], "verbs": ["create", "update", "patch", "delete", "deletecollection"]}]),
        ),
        role(
            "wirerate-admin",
            &["admin"],
            json!([
                {"apiGroups": ["wirerate.io"], "resources": ["dtnpools", "dtnpoolbindings"], "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
                // What a pool's agents get; an admin holds it so they may create pools.
                {"apiGroups": ["wirerate.io"], "resources": ["transfers/status", "dtnpools/status"], "verbs": ["patch", "update"]},
                // The agents record Events with events.k8s.io, which the built-in admin role lacks.
                {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            ]),
        ),
    ]
}

/// The operator's command line: the metrics address, and the host paths
/// pools may mount when the values list any (the chart: a block Helm
/// renders only then).
fn args(t: Target, metrics_arg: Value, v: &Value) -> Value {
    let mut args = vec![json!("--metrics-addr"), metrics_arg];
    let flag = format!("--{ALLOWED_HOST_PATHS_FLAG}");
    match t {
        Target::Chart => args.push(json!(format!("@@flag:allowedHostPaths:{flag}@@"))),
        Target::Install => {
            let paths: Vec<&str> = v["allowedHostPaths"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if !paths.is_empty() {
                args.push(json!(format!("{flag}={}", paths.join(","))));
            }
        }
    }
    Value::Array(args)
}

/// The operator's own objects.
pub fn operator(t: Target) -> Vec<Value> {
    let v = values();
    let port = knob(t, "metricsPort", json!(METRICS_PORT));
    let image = knob(t, "image", json!(format!("{IMAGE}:{VERSION}")));
    let metrics_arg = match t {
        Target::Install => json!(format!("0.0.0.0:{METRICS_PORT}")),
        Target::Chart => json!("@@metricsAddr@@"),
    };
    let mut out = Vec::new();
    if t == Target::Install {
        out.push(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": NAMESPACE,
                "labels": {
                    // The operator's pods meet the restricted standard.
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "app.kubernetes.io/part-of": "wirerate",
                },
            },
        }));
    }
    out.push(json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": NAME, "namespace": namespace(t), "labels": labels(t)},
    }));
    out.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": NAME, "labels": labels(t)},
        "rules": cluster_role_rules(),
    }));
    out.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": NAME, "labels": labels(t)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace(t)}],
    }));
    let probe = |path: &str, initial: i32| {
        json!({
            "httpGet": {"path": path, "port": "metrics"},
            "initialDelaySeconds": initial,
            "periodSeconds": 10,
        })
    };
    let mut pod_spec = json!({
        "serviceAccountName": NAME,
        "securityContext": knob(t, "with:podSecurityContext:securityContext", v["podSecurityContext"].clone()),
        "containers": [{
            "name": "operator",
            "image": image,
            "imagePullPolicy": knob(t, "pullPolicy", v["image"]["pullPolicy"].clone()),
            "args": args(t, metrics_arg, &v),
            "env": [
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            ],
            "ports": [{"name": "metrics", "containerPort": port.clone(), "protocol": "TCP"}],
            "readinessProbe": probe("/readyz", 0),
            "livenessProbe": probe("/healthz", 15),
            "resources": knob(t, "with:resources:resources", v["resources"].clone()),
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "runAsNonRoot": true,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }],
    });
    if t == Target::Chart {
        pod_spec["nodeSelector"] = json!("@@with:nodeSelector:nodeSelector@@");
        pod_spec["tolerations"] = json!("@@with:tolerations:tolerations@@");
    }
    out.push(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": namespace(t), "labels": labels(t)},
        "spec": {
            "replicas": knob(t, "replicas", json!(REPLICAS)),
            "selector": {"matchLabels": selector()},
            "template": {
                "metadata": {"labels": selector()},
                "spec": pod_spec,
            },
        },
    }));
    out.push(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": format!("{NAME}-metrics"), "namespace": namespace(t), "labels": labels(t)},
        "spec": {
            "selector": selector(),
            "ports": [{"name": "metrics", "port": port.clone(), "targetPort": "metrics", "protocol": "TCP"}],
        },
    }));
    out.extend(user_roles(t));
    out
}

/// The Prometheus Operator's ServiceMonitor for the metrics Service (the
/// chart renders it when `serviceMonitor.enabled`).
pub fn service_monitor() -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {
            "name": NAME,
            "namespace": "@@namespace@@",
            "labels": {"@@include:wirerate.labels@@": "", "@@with-inline:serviceMonitor.labels@@": ""},
        },
        "spec": {
            "selector": {"matchLabels": selector()},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "@@serviceMonitorInterval@@"}],
        },
    })
}

/// A PodMonitor for every pool's agents, in whichever namespace (their
/// pods carry the same name label; the port is named `metrics`).
pub fn agent_pod_monitor() -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": "wirerate-agents",
            "namespace": "@@namespace@@",
            "labels": {"@@include:wirerate.labels@@": "", "@@with-inline:serviceMonitor.labels@@": ""},
        },
        "spec": {
            "namespaceSelector": {"any": true},
            "selector": {"matchLabels": {"app.kubernetes.io/name": wirerate_crds::contract::APP_NAME}},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "@@serviceMonitorInterval@@"}],
        },
    })
}

/// Helm expressions for the placeholders `knob` and friends put in.
fn expression(name: &str) -> Option<&'static str> {
    Some(match name {
        "namespace" => "{{ .Release.Namespace }}",
        "image" => {
            "\"{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}\""
        }
        "pullPolicy" => "{{ .Values.image.pullPolicy }}",
        "replicas" => "{{ .Values.replicas }}",
        "metricsPort" => "{{ .Values.metricsPort }}",
        "metricsAddr" => "\"0.0.0.0:{{ .Values.metricsPort }}\"",
        "serviceMonitorInterval" => "{{ .Values.serviceMonitor.interval }}",
        _ => return None,
    })
}

/// Turns YAML with placeholders into a Helm template. Placeholders are
/// whole scalars (`'@@name@@'`), whole blocks (`key: '@@with:value:key@@'`,
/// emitted only when the value is set), lines of a map
/// (`'@@include:template@@': ''`) or items of a command line
/// (`- '@@flag:value:--flag@@'`: `--flag=a,b` from the list `value`,
/// emitted only when it is not empty).
pub fn helmify(yaml: &str) -> String {
    let mut out = String::new();
    for line in yaml.lines() {
        let indent = line.len() - line.trim_start().len();
        let pad = " ".repeat(indent);
        let body = line.trim_start();
        if let Some(rest) = body.strip_prefix("- '@@flag:") {
            let (value, flag) = rest
                .trim_end_matches("@@'")
                .split_once(':')
                .unwrap_or_default();
            out.push_str(&format!(
                "{pad}{{{{- with .Values.{value} }}}}\n{pad}- {{{{ printf \"{flag}=%s\" (join \",\" .) | quote }}}}\n{pad}{{{{- end }}}}\n"
            ));
            continue;
        }
        if let Some(rest) = body.strip_prefix("'@@include:") {
            let name = rest.split("@@").next().unwrap_or_default();
            out.push_str(&format!(
                "{pad}{{{{- include \"{name}\" . | nindent {indent} }}}}\n"
            ));
            continue;
        }
        if let Some(rest) = body.strip_prefix("'@@with-inline:") {
            let value = rest.split("@@").next().unwrap_or_default();
            out.push_str(&format!(
                "{pad}{{{{- with .Values.{value} }}}}\n{pad}{{{{- toYaml . | nindent {indent} }}}}\n{pad}{{{{- end }}}}\n"
            ));
            continue;
        }
        if let Some((key, rest)) = body.split_once(": '@@with:") {
            let mut parts = rest.trim_end_matches("@@'").split(':');
            let value = parts.next().unwrap_or_default();
            out.push_str(&format!(
                "{pad}{{{{- with .Values.{value} }}}}\n{pad}{key}:\n{pad}  {{{{- toYaml . | nindent {} }}}}\n{pad}{{{{- end }}}}\n",
                indent + 2
            ));
            continue;
        }
        let mut l = line.to_owned();
        while let Some(start) = l.find("'@@") {
            let Some(len) = l[start + 3..].find("@@'") else {
                break;
            };
            let name = &l[start + 3..start + 3 + len];
            let Some(expr) = expression(name) else {
                break;
            };
            l.replace_range(start..start + 3 + len + 3, expr);
        }
        out.push_str(&l);
        out.push('\n');
    }
    out
}

fn stream(objects: &[Value]) -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(o)?);
    }
    Ok(out)
}

/// What install.yaml needs of the API server, said where it is read:
/// kubectl's own error for the policies on an older one blames the CRDs.
const REQUIRES: &str = "# Needs Kubernetes 1.30 or later: the admission policies at the end are\n\
# admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies (GA in 1.30). On an\n\
# older API server kubectl ends with 'no matches for kind \"ValidatingAdmissionPolicy\"\n\
# ... ensure CRDs are installed first': that means the server is too old, not that\n\
# the CRDs are missing. Without the policies a user who may create DtnPools gets\n\
# what they render (host network, host paths): do not run wirerate there.\n";

const GENERATED: &str =
    "# Generated by `cargo run -p wirerate-operator --bin manifestgen`; do not edit by hand.\n";

/// manifests/install.yaml: CRDs, namespace, RBAC, operator, metrics
/// Service, user roles, admission policies.
pub fn install_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::from(GENERATED);
    out.push_str(
        "# The whole install: kubectl apply -f manifests/install.yaml (or -k manifests/).\n",
    );
    out.push_str(REQUIRES);
    let crds = wirerate_crds::crds_yaml()?;
    for doc in crds
        .split("\n---\n")
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        let body: String = doc
            .lines()
            .filter(|l| !l.starts_with('#') && *l != "---")
            .map(|l| format!("{l}\n"))
            .collect();
        if !body.trim().is_empty() {
            out.push_str("---\n");
            out.push_str(&body);
        }
    }
    out.push_str(&stream(&operator(Target::Install))?);
    out.push_str(&stream(&admission::policies())?);
    Ok(out)
}

/// The chart's files that are generated, by path beneath charts/wirerate.
pub fn chart_files() -> Result<Vec<(&'static str, String)>, serde_yaml::Error> {
    let mut values_yaml = String::from(GENERATED);
    values_yaml.push_str(VALUES_HEADER);
    values_yaml.push_str(&serde_yaml::to_string(&values())?);
    let operator_yaml = format!("{GENERATED}{}", helmify(&stream(&operator(Target::Chart))?));
    let monitor = format!(
        "{GENERATED}{{{{- if .Values.serviceMonitor.enabled }}}}\n{}{{{{- end }}}}\n",
        helmify(&stream(&[service_monitor(), agent_pod_monitor()])?)
    );
    Ok(vec![
        ("values.yaml", values_yaml),
        ("templates/operator.yaml", operator_yaml),
        ("templates/servicemonitor.yaml", monitor),
        (
            "templates/dashboard.yaml",
            format!("{GENERATED}{DASHBOARD}"),
        ),
        ("templates/_helpers.tpl", format!("{GENERATED}{HELPERS}")),
        ("templates/NOTES.txt", NOTES.to_owned()),
    ])
}

const VALUES_HEADER: &str = "# The operator's settings. DtnPools name their own agent image.
# image.tag empty: the chart's appVersion. replicas: two are safe, only the
# holder of the leader Lease reconciles. serviceMonitor needs the Prometheus
# Operator's CRDs. grafanaDashboard: a ConfigMap holding
# dashboards/wirerate.json, with the label Grafana's dashboard sidecar looks for.
# allowedHostPaths: the host directories DtnPools may mount (the operator's
# --allowed-host-paths), e.g. [/lustre, /data]; a pool mounting any other is
# refused. Empty: any but the host's root and system directories.
";

/// The Grafana dashboard as a ConfigMap for Grafana's sidecar.
const DASHBOARD: &str = r#"{{- if .Values.grafanaDashboard.enabled }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: wirerate-dashboard
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "wirerate.labels" . | nindent 4 }}
    {{- with .Values.grafanaDashboard.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
data:
  wirerate.json: |-
{{ .Files.Get "dashboards/wirerate.json" | indent 4 }}
{{- end }}
"#;

const HELPERS: &str = r#"{{/* Labels of every object the chart creates. */}}
{{- define "wirerate.labels" -}}
app.kubernetes.io/name: wirerate-operator
app.kubernetes.io/part-of: wirerate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}
"#;

const NOTES: &str = r#"wirerate {{ .Chart.AppVersion }} is installed in {{ .Release.Namespace }}.

Check the operator:
  kubectl -n {{ .Release.Namespace }} rollout status deployment/wirerate-operator

Next, as a namespace admin:
  1. A DtnPool of agents on your DTN nodes (manifests/examples/dtnpool-lustre.yaml).
     For io_uring, install deploy/seccomp/wirerate-agent.json on those nodes as
     /var/lib/kubelet/seccomp/profiles/wirerate-agent.json and set
     spec.seccompProfile {type: Localhost, localhostProfile: profiles/wirerate-agent.json}.
  2. A Transfer (manifests/examples/transfer.yaml), then:
     kubectl get transfers -A -o wide -w
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(path: &str) -> String {
        format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn committed_install_and_chart_are_current() {
        let fix = "run `cargo run -p wirerate-operator --bin manifestgen`";
        let install = std::fs::read_to_string(repo("manifests/install.yaml")).unwrap_or_default();
        assert!(
            install == install_yaml().unwrap(),
            "manifests/install.yaml is stale: {fix}"
        );
        for (path, text) in chart_files().unwrap() {
            let committed = std::fs::read_to_string(repo(&format!("charts/wirerate/{path}")))
                .unwrap_or_default();
            assert!(committed == text, "charts/wirerate/{path} is stale: {fix}");
        }
    }

    #[test]
    fn every_placeholder_of_the_chart_becomes_a_helm_expression() {
        for (path, text) in chart_files().unwrap() {
            assert!(!text.contains("@@"), "{path} keeps a placeholder:\n{text}");
        }
        let (_, operator) = chart_files()
            .unwrap()
            .into_iter()
            .find(|(p, _)| *p == "templates/operator.yaml")
            .unwrap();
        for expr in [
            "replicas: {{ .Values.replicas }}",
            "image: \"{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}\"",
            "{{- with .Values.nodeSelector }}",
            "{{- with .Values.tolerations }}",
            "{{- toYaml . | nindent 10 }}",
            "namespace: {{ .Release.Namespace }}",
            "        {{- with .Values.allowedHostPaths }}\n        - {{ printf \"--allowed-host-paths=%s\" (join \",\" .) | quote }}\n        {{- end }}\n",
        ] {
            assert!(operator.contains(expr), "no {expr:?} in\n{operator}");
        }
    }

    // The chart had no value for --allowed-host-paths: an admin had to
    // patch the Deployment to confine the pools' host paths.
    #[test]
    fn allowed_host_paths_reach_the_operators_command_line() {
        let args = |v: &Value| args(Target::Install, json!("0.0.0.0:8080"), v);
        assert_eq!(
            args(&values()),
            json!(["--metrics-addr", "0.0.0.0:8080"]),
            "none by default: the operator's own rule"
        );
        let mut v = values();
        v["allowedHostPaths"] = json!(["/lustre", "/data"]);
        assert_eq!(
            args(&v)[2],
            "--allowed-host-paths=/lustre,/data",
            "as the operator parses it (comma-delimited)"
        );
    }

    #[test]
    fn install_takes_the_charts_defaults() {
        let objects = operator(Target::Install);
        let deploy = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let v = values();
        assert_eq!(deploy["spec"]["replicas"], v["replicas"]);
        let pod = &deploy["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"], v["podSecurityContext"]);
        assert_eq!(pod["containers"][0]["resources"], v["resources"]);
        assert_eq!(
            pod["containers"][0]["image"],
            format!("{IMAGE}:{VERSION}").as_str()
        );
    }
}
