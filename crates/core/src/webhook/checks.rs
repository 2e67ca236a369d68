//! What the admission webhook refuses: pure checks of the four kinds, each problem naming its
//! field, all problems at once.
//!
//! The CRDs' schemas and CEL rules already refuse what they can express (types, enums,
//! `maxSurge: "abc"`, a selector that does not match the template's labels). These are the
//! checks they cannot: fields that must decode as Go durations (a Machine whose
//! `drainTimeout` does not decode cannot be read by any controller), annotations (CEL cannot
//! see them), label and taint syntax inside templates, label-selector expressions, the
//! rollout strategy as the MachineDeployment controller resolves it, and a MachineClass's
//! `providerSpec` by the provider's own rules ([`mcm_driver::Driver::validate_machine_class`]).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use mcm_api::constants::annotations;
use mcm_api::constants::annotations::policy;
use mcm_api::preservation::PreserveValue;
use mcm_api::{
    ClassSpec, Machine, MachineClass, MachineDeployment, MachineSet, MachineSpec,
    MachineTemplateSpec,
};
use mcm_driver::{Driver, SpecProblem};
use serde::de::DeserializeOwned;

/// The kinds the webhook checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `MachineClass`.
    MachineClass,
    /// `Machine`.
    Machine,
    /// `MachineSet`.
    MachineSet,
    /// `MachineDeployment`.
    MachineDeployment,
}

impl Kind {
    /// The kind of an admission request's `kind.kind`; `None` for any other kind.
    pub fn parse(kind: &str) -> Option<Kind> {
        match kind {
            "MachineClass" => Some(Kind::MachineClass),
            "Machine" => Some(Kind::Machine),
            "MachineSet" => Some(Kind::MachineSet),
            "MachineDeployment" => Some(Kind::MachineDeployment),
            _ => None,
        }
    }

    /// The kind's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::MachineClass => "MachineClass",
            Kind::Machine => "Machine",
            Kind::MachineSet => "MachineSet",
            Kind::MachineDeployment => "MachineDeployment",
        }
    }
}

/// What the checks need besides the object.
pub struct Context<'a> {
    /// The provider's driver: its rules for `providerSpec`.
    pub driver: &'a dyn Driver,
    /// Whether the controllers run with a target cluster (`--target-kubeconfig` not `none`):
    /// an in-place update needs one.
    pub target_cluster: bool,
}

/// Every problem of `object` (the JSON of the admitted object) as a `kind`.
pub fn problems(kind: Kind, object: &serde_json::Value, ctx: &Context<'_>) -> Vec<SpecProblem> {
    // The timeouts are inlined into the machine spec (flattened), where a decode error
    // loses its path: they are checked by name first.
    let durations = duration_problems(kind, object);
    if !durations.is_empty() {
        return durations;
    }
    match kind {
        Kind::MachineClass => decoded::<MachineClass>(object)
            .map(|c| machine_class(&c, ctx.driver))
            .unwrap_or_else(|p| vec![p]),
        Kind::Machine => decoded::<Machine>(object)
            .map(|m| machine(&m))
            .unwrap_or_else(|p| vec![p]),
        Kind::MachineSet => decoded::<MachineSet>(object)
            .map(|s| machine_set(&s))
            .unwrap_or_else(|p| vec![p]),
        Kind::MachineDeployment => decoded::<MachineDeployment>(object)
            .map(|d| machine_deployment(&d, ctx.target_cluster))
            .unwrap_or_else(|p| vec![p]),
    }
}

/// The admission warnings of `object` as a `kind`: a MachineClass's providerSpec keys the
/// provider ignores ([`Driver::machine_class_warnings`]); none for other kinds.
pub fn warnings(kind: Kind, object: &serde_json::Value, ctx: &Context<'_>) -> Vec<String> {
    match kind {
        Kind::MachineClass => decoded::<MachineClass>(object)
            .map(|c| ctx.driver.machine_class_warnings(&c))
            .unwrap_or_default(),
        Kind::Machine | Kind::MachineSet | Kind::MachineDeployment => Vec::new(),
    }
}

/// The denial message of `problems`: `invalid <Kind> "<name>": <field>: <detail>; ...`.
pub fn message(kind: Kind, name: &str, problems: &[SpecProblem]) -> String {
    format!(
        "invalid {} {name:?}: {}",
        kind.as_str(),
        mcm_driver::spec::join(problems)
    )
}

/// The Go-duration fields of a machine spec (`MachineConfiguration`, inlined).
const DURATION_FIELDS: [&str; 5] = [
    "drainTimeout",
    "healthTimeout",
    "creationTimeout",
    "inPlaceUpdateTimeout",
    "machinePreserveTimeout",
];

/// Problems of the machine spec's duration fields, each at its path.
fn duration_problems(kind: Kind, object: &serde_json::Value) -> Vec<SpecProblem> {
    let at = match kind {
        Kind::MachineClass => return Vec::new(),
        Kind::Machine => "spec",
        Kind::MachineSet | Kind::MachineDeployment => "spec.template.spec",
    };
    let spec = at.split('.').try_fold(object, |v, k| v.get(k));
    let Some(spec) = spec else {
        return Vec::new();
    };
    DURATION_FIELDS
        .iter()
        .filter_map(|f| {
            let value = spec.get(*f)?;
            let detail = match value.as_str() {
                Some(text) => mcm_api::duration::parse_go_duration(text)
                    .err()
                    .map(|e| format!("{text:?} is not a duration (e.g. 10m, 1h30m): {e}")),
                None if value.is_null() => None,
                None => Some(format!("must be a duration string (e.g. 10m), got {value}")),
            }?;
            Some(SpecProblem::new(format!("{at}.{f}"), detail))
        })
        .collect()
}

/// The typed object, or the problem that keeps it from decoding, at the field that does not
/// decode (`spec.drainTimeout: invalid Go duration ...`).
fn decoded<T: DeserializeOwned>(object: &serde_json::Value) -> Result<T, SpecProblem> {
    serde_path_to_error::deserialize::<_, T>(object).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        SpecProblem::new(field, e.into_inner().to_string())
    })
}

/// A MachineClass: the shape every provider needs, then the provider's own rules.
pub fn machine_class(class: &MachineClass, driver: &dyn Driver) -> Vec<SpecProblem> {
    let mut out: Vec<SpecProblem> = mcm_reconcilers::class_problems(class);
    out.extend(driver.validate_machine_class(class));
    out
}

/// A Machine: its class reference, node template and annotations.
pub fn machine(m: &Machine) -> Vec<SpecProblem> {
    let mut out = Vec::new();
    machine_annotations(m.metadata.annotations.as_ref(), &mut out);
    machine_spec(&m.spec, "spec", &mut out);
    out
}

/// A MachineSet: selector, template and annotations.
pub fn machine_set(s: &MachineSet) -> Vec<SpecProblem> {
    let mut out = Vec::new();
    creation_timeout_annotation(s.metadata.annotations.as_ref(), &mut out);
    if let Some(selector) = &s.spec.selector {
        label_selector(selector, "spec.selector", &mut out);
    }
    if let Some(t) = &s.spec.template {
        template(t, &mut out);
    }
    out
}

/// A MachineDeployment: selector, template, annotations and the strategy as the controller
/// resolves it.
pub fn machine_deployment(d: &MachineDeployment, target_cluster: bool) -> Vec<SpecProblem> {
    let mut out = Vec::new();
    creation_timeout_annotation(d.metadata.annotations.as_ref(), &mut out);
    if let Some(anns) = d.metadata.annotations.as_ref() {
        policy_annotations_at(anns, "metadata.annotations", &mut out);
        if let Err(e) = mcm_api::policy::remediation::policy_of(Some(anns)) {
            out.push(SpecProblem::new(
                format!("metadata.annotations[{}]", e.annotation),
                e.source.to_string(),
            ));
        }
    }
    if let Some(selector) = &d.spec.selector {
        label_selector(selector, "spec.selector", &mut out);
    }
    template(&d.spec.template, &mut out);
    if let Err(e) = mcm_api::policy::strategy::strategy_of(d, target_cluster) {
        // The controller's messages name their field already (`spec.strategy...: ...`).
        let text = e.to_string();
        match text.split_once(": ") {
            Some((field, detail)) if field.starts_with("spec.") => {
                out.push(SpecProblem::new(field, detail))
            }
            _ => out.push(SpecProblem::new("spec.strategy", text)),
        }
    }
    out
}

fn template(t: &MachineTemplateSpec, out: &mut Vec<SpecProblem>) {
    if let Some(meta) = &t.metadata {
        labels(meta.labels.as_ref(), "spec.template.metadata.labels", out);
        machine_annotations_at(
            meta.annotations.as_ref(),
            "spec.template.metadata.annotations",
            out,
        );
    }
    match &t.spec {
        Some(spec) => machine_spec(spec, "spec.template.spec", out),
        None => out.push(SpecProblem::new(
            "spec.template.spec.class.name",
            "is required: the MachineClass of the machines",
        )),
    }
}

fn machine_spec(spec: &MachineSpec, at: &str, out: &mut Vec<SpecProblem>) {
    class_reference(spec.class.as_ref(), &format!("{at}.class"), out);
    if let Some(t) = &spec.node_template {
        if let Some(meta) = &t.metadata {
            labels(
                meta.labels.as_ref(),
                &format!("{at}.nodeTemplate.metadata.labels"),
                out,
            );
        }
        if let Some(node) = &t.spec {
            for (i, taint) in node.taints.iter().flatten().enumerate() {
                let field = format!("{at}.nodeTemplate.spec.taints[{i}]");
                if !TAINT_EFFECTS.contains(&taint.effect.as_str()) {
                    out.push(SpecProblem::new(
                        format!("{field}.effect"),
                        format!(
                            "{:?} must be one of {}",
                            taint.effect,
                            TAINT_EFFECTS.join(", ")
                        ),
                    ));
                }
                if let Err(detail) = qualified_name(&taint.key) {
                    out.push(SpecProblem::new(format!("{field}.key"), detail));
                }
            }
        }
    }
    if let Some(n) = spec.configuration.max_evict_retries
        && n < 0
    {
        out.push(SpecProblem::new(
            format!("{at}.maxEvictRetries"),
            format!("{n} must not be negative"),
        ));
    }
}

const TAINT_EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// Upstream requires the class's name; its kind, when given, must be `MachineClass` (the
/// only class kind left upstream).
fn class_reference(class: Option<&ClassSpec>, at: &str, out: &mut Vec<SpecProblem>) {
    if class
        .and_then(|c| c.name.as_deref())
        .is_none_or(|n| n.trim().is_empty())
    {
        out.push(SpecProblem::new(
            format!("{at}.name"),
            "is required: the MachineClass of the machine",
        ));
    }
    if let Some(kind) = class.and_then(|c| c.kind.as_deref())
        && !kind.is_empty()
        && kind != "MachineClass"
    {
        out.push(SpecProblem::new(
            format!("{at}.kind"),
            format!("{kind:?} is not supported: use MachineClass"),
        ));
    }
}

fn machine_annotations(anns: Option<&BTreeMap<String, String>>, out: &mut Vec<SpecProblem>) {
    machine_annotations_at(anns, "metadata.annotations", out);
}

/// The annotations a Machine (or a template of Machines) may carry with a value the
/// controllers parse.
fn machine_annotations_at(
    anns: Option<&BTreeMap<String, String>>,
    at: &str,
    out: &mut Vec<SpecProblem>,
) {
    let Some(anns) = anns else { return };
    if let Some(v) = anns.get(annotations::PRESERVE)
        && PreserveValue::parse(v).is_none()
    {
        out.push(SpecProblem::new(
            format!("{at}[{}]", annotations::PRESERVE),
            format!(
                "{v:?} must be one of {:?}, {:?}, {:?} or {:?}",
                PreserveValue::Now.as_str(),
                PreserveValue::WhenFailed.as_str(),
                PreserveValue::AutoPreserved.as_str(),
                PreserveValue::False.as_str()
            ),
        ));
    }
    if let Some(v) = anns.get(annotations::MACHINE_PRIORITY)
        && v.trim().parse::<i32>().is_err()
    {
        out.push(SpecProblem::new(
            format!("{at}[{}]", annotations::MACHINE_PRIORITY),
            format!("{v:?} must be an integer (1 is deleted first, default 3)"),
        ));
    }
    creation_timeout_at(anns, at, out);
    policy_annotations_at(anns, at, out);
}

/// The health annotations (mcm-rs) of a Machine, a template or a MachineDeployment.
fn policy_annotations_at(anns: &BTreeMap<String, String>, at: &str, out: &mut Vec<SpecProblem>) {
    use mcm_api::policy::health;
    let found = (
        anns.get(policy::UNHEALTHY_CONDITIONS)
            .map(|v| health::parse_rules(v).err()),
        anns.get(policy::NODE_STARTUP_TIMEOUT)
            .map(|v| health::parse_node_startup_timeout(v).err()),
    );
    if let (Some(Some(e)), _) = &found {
        out.push(SpecProblem::new(
            format!("{at}[{}]", policy::UNHEALTHY_CONDITIONS),
            e.to_string(),
        ));
    }
    if let (_, Some(Some(e))) = &found {
        out.push(SpecProblem::new(
            format!("{at}[{}]", policy::NODE_STARTUP_TIMEOUT),
            e.to_string(),
        ));
    }
}

fn creation_timeout_annotation(
    anns: Option<&BTreeMap<String, String>>,
    out: &mut Vec<SpecProblem>,
) {
    if let Some(anns) = anns {
        creation_timeout_at(anns, "metadata.annotations", out);
    }
}

fn creation_timeout_at(anns: &BTreeMap<String, String>, at: &str, out: &mut Vec<SpecProblem>) {
    if let Some(v) = anns.get(annotations::EFFECTIVE_CREATION_TIMEOUT)
        && let Err(e) = mcm_api::duration::parse_go_duration(v)
    {
        out.push(SpecProblem::new(
            format!("{at}[{}]", annotations::EFFECTIVE_CREATION_TIMEOUT),
            format!("{v:?} is not a duration: {e}"),
        ));
    }
}

fn label_selector(selector: &LabelSelector, at: &str, out: &mut Vec<SpecProblem>) {
    labels(
        selector.match_labels.as_ref(),
        &format!("{at}.matchLabels"),
        out,
    );
    for (i, e) in selector.match_expressions.iter().flatten().enumerate() {
        let field = format!("{at}.matchExpressions[{i}]");
        if let Err(detail) = qualified_name(&e.key) {
            out.push(SpecProblem::new(format!("{field}.key"), detail));
        }
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => out.push(SpecProblem::new(
                format!("{field}.values"),
                format!("must be non-empty when operator is {}", e.operator),
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => out.push(SpecProblem::new(
                format!("{field}.values"),
                format!("must be empty when operator is {}", e.operator),
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => out.push(SpecProblem::new(
                format!("{field}.operator"),
                format!(
                    "{other:?} is not a valid selector operator (In, NotIn, Exists, DoesNotExist)"
                ),
            )),
        }
        for (j, v) in values.iter().enumerate() {
            if let Err(detail) = label_value(v) {
                out.push(SpecProblem::new(format!("{field}.values[{j}]"), detail));
            }
        }
    }
}

fn labels(labels: Option<&BTreeMap<String, String>>, at: &str, out: &mut Vec<SpecProblem>) {
    for (k, v) in labels.into_iter().flatten() {
        if let Err(detail) = qualified_name(k) {
            out.push(SpecProblem::new(format!("{at}[{k}]"), detail));
        }
        if let Err(detail) = label_value(v) {
            out.push(SpecProblem::new(format!("{at}[{k}]"), detail));
        }
    }
}

fn qualified_name(key: &str) -> Result<(), String> {
    mcm_api::syntax::label_key(key).map_err(|e| e.to_string())
}

fn label_value(value: &str) -> Result<(), String> {
    mcm_api::syntax::label_value(value).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcm_driver::FakeDriver;
    use serde_json::json;

    fn ctx(driver: &FakeDriver) -> Context<'_> {
        Context {
            driver,
            target_cluster: true,
        }
    }

    fn fields(p: &[SpecProblem]) -> Vec<&str> {
        p.iter().map(|p| p.field.as_str()).collect()
    }

    fn deployment(spec: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "MachineDeployment",
            "metadata": {"name": "d"},
            "spec": spec,
        })
    }

    #[test]
    fn a_good_deployment_has_no_problem() {
        let d = FakeDriver::new();
        let obj = deployment(json!({
            "replicas": 2,
            "selector": {"matchLabels": {"name": "w"}},
            "template": {
                "metadata": {"labels": {"name": "w"}},
                "spec": {"class": {"kind": "MachineClass", "name": "c"}, "drainTimeout": "5m"},
            },
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
        }));
        assert_eq!(problems(Kind::MachineDeployment, &obj, &ctx(&d)), vec![]);
    }

    #[test]
    fn a_duration_that_does_not_decode_is_named_by_its_path() {
        let d = FakeDriver::new();
        let obj = deployment(json!({
            "template": {"spec": {"class": {"name": "c"}, "drainTimeout": "ten minutes"}},
        }));
        let p = problems(Kind::MachineDeployment, &obj, &ctx(&d));
        assert_eq!(fields(&p), vec!["spec.template.spec.drainTimeout"], "{p:?}");
    }

    #[test]
    fn every_problem_of_a_deployment_is_reported_at_once() {
        let d = FakeDriver::new();
        let obj = deployment(json!({
            "selector": {"matchExpressions": [
                {"key": "name", "operator": "In"},
                {"key": "zone", "operator": "Near", "values": ["a"]},
            ]},
            "template": {
                "metadata": {
                    "labels": {"bad key!": "v"},
                    "annotations": {"node.machine.sapcloud.io/preserve": "forever"},
                },
                "spec": {
                    "class": {"kind": "AWSMachineClass"},
                    "nodeTemplate": {"spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}},
                },
            },
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "abc"}},
        }));
        let mut obj = obj;
        obj["metadata"]["annotations"] =
            json!({"node.machine.sapcloud.io/effective-creation-timeout": "soon"});
        let p = problems(Kind::MachineDeployment, &obj, &ctx(&d));
        assert_eq!(
            fields(&p),
            vec![
                "metadata.annotations[node.machine.sapcloud.io/effective-creation-timeout]",
                "spec.selector.matchExpressions[0].values",
                "spec.selector.matchExpressions[1].operator",
                "spec.template.metadata.labels[bad key!]",
                "spec.template.metadata.annotations[node.machine.sapcloud.io/preserve]",
                "spec.template.spec.class.name",
                "spec.template.spec.class.kind",
                "spec.template.spec.nodeTemplate.spec.taints[0].effect",
                "spec.strategy.rollingUpdate.maxSurge",
            ],
            "{p:#?}"
        );
        let text = message(Kind::MachineDeployment, "d", &p);
        assert!(
            text.starts_with("invalid MachineDeployment \"d\": "),
            "{text}"
        );
        assert!(text.contains("\"abc\""), "{text}");
    }

    #[test]
    fn an_in_place_update_needs_a_target_cluster() {
        let d = FakeDriver::new();
        let obj = deployment(json!({
            "template": {"spec": {"class": {"name": "c"}}},
            "strategy": {"type": "InPlaceUpdate", "inPlaceUpdate": {"maxSurge": 0, "maxUnavailable": 1, "orchestrationType": "Auto"}},
        }));
        let with = Context {
            driver: &d,
            target_cluster: true,
        };
        assert_eq!(problems(Kind::MachineDeployment, &obj, &with), vec![]);
        let without = Context {
            driver: &d,
            target_cluster: false,
        };
        let p = problems(Kind::MachineDeployment, &obj, &without);
        assert_eq!(fields(&p), vec!["spec.strategy"], "{p:?}");
    }

    #[test]
    fn machine_annotations_the_controllers_parse_are_checked() {
        let d = FakeDriver::new();
        let obj = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": "m", "annotations": {
                "machinepriority.machine.sapcloud.io": "high",
                "node.machine.sapcloud.io/preserve": "when-failed",
            }},
            "spec": {"class": {"kind": "MachineClass", "name": "c"}, "maxEvictRetries": -1},
        });
        let p = problems(Kind::Machine, &obj, &ctx(&d));
        assert_eq!(
            fields(&p),
            vec![
                "metadata.annotations[machinepriority.machine.sapcloud.io]",
                "spec.maxEvictRetries"
            ],
            "{p:?}"
        );
    }

    #[test]
    fn health_and_remediation_annotations_are_checked() {
        let d = FakeDriver::new();
        let mut obj = deployment(json!({
            "template": {
                "metadata": {"annotations": {
                    "health.mcm-rs.io/unhealthy-conditions": "Ready=Maybe:1m",
                }},
                "spec": {"class": {"name": "c"}},
            },
        }));
        obj["metadata"]["annotations"] = json!({
            "remediation.mcm-rs.io/max-unhealthy": "lots",
            "remediation.mcm-rs.io/max-in-flight": "25%",
            "health.mcm-rs.io/node-startup-timeout": "five minutes",
        });
        let p = problems(Kind::MachineDeployment, &obj, &ctx(&d));
        assert_eq!(
            fields(&p),
            vec![
                "metadata.annotations[health.mcm-rs.io/node-startup-timeout]",
                "metadata.annotations[remediation.mcm-rs.io/max-unhealthy]",
                "spec.template.metadata.annotations[health.mcm-rs.io/unhealthy-conditions]",
            ],
            "{p:?}"
        );
        obj["metadata"]["annotations"] = json!({
            "remediation.mcm-rs.io/max-unhealthy": "40%",
            "health.mcm-rs.io/unhealthy-conditions": "Ready=Unknown:5m,KernelDeadlock=True:1m",
        });
        obj["spec"]["template"]["metadata"] = json!({});
        assert_eq!(problems(Kind::MachineDeployment, &obj, &ctx(&d)), vec![]);
    }

    #[test]
    fn a_set_without_a_template_misses_its_class() {
        let d = FakeDriver::new();
        let obj = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet",
            "metadata": {"name": "s"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"name": "w"}}},
        });
        assert_eq!(problems(Kind::MachineSet, &obj, &ctx(&d)), vec![]);
        let obj = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet",
            "metadata": {"name": "s"},
            "spec": {"template": {"metadata": {"labels": {"name": "w"}}}},
        });
        let p = problems(Kind::MachineSet, &obj, &ctx(&d));
        assert_eq!(fields(&p), vec!["spec.template.spec.class.name"], "{p:?}");
    }

    #[test]
    fn a_class_is_checked_by_the_generic_rules_and_by_the_driver() {
        struct Strict;
        #[async_trait::async_trait]
        impl Driver for Strict {
            async fn create_machine(
                &self,
                _: mcm_driver::CreateMachineRequest,
            ) -> Result<mcm_driver::CreateMachineResponse, mcm_driver::DriverError> {
                Err(mcm_driver::DriverError::unimplemented("test"))
            }
            async fn delete_machine(
                &self,
                _: mcm_driver::DeleteMachineRequest,
            ) -> Result<mcm_driver::DeleteMachineResponse, mcm_driver::DriverError> {
                Err(mcm_driver::DriverError::unimplemented("test"))
            }
            async fn get_machine_status(
                &self,
                _: mcm_driver::GetMachineStatusRequest,
            ) -> Result<mcm_driver::GetMachineStatusResponse, mcm_driver::DriverError> {
                Err(mcm_driver::DriverError::unimplemented("test"))
            }
            async fn list_machines(
                &self,
                _: mcm_driver::ListMachinesRequest,
            ) -> Result<mcm_driver::ListMachinesResponse, mcm_driver::DriverError> {
                Err(mcm_driver::DriverError::unimplemented("test"))
            }
            async fn get_volume_ids(
                &self,
                _: mcm_driver::GetVolumeIdsRequest,
            ) -> Result<mcm_driver::GetVolumeIdsResponse, mcm_driver::DriverError> {
                Err(mcm_driver::DriverError::unimplemented("test"))
            }
            fn validate_machine_class(&self, class: &MachineClass) -> Vec<SpecProblem> {
                match class.provider_spec.get("cpu") {
                    Some(serde_json::Value::String(s)) if s.parse::<u32>().is_err() => {
                        vec![SpecProblem::new("providerSpec.cpu", "must be a number")]
                    }
                    _ => vec![],
                }
            }
            fn machine_class_warnings(&self, class: &MachineClass) -> Vec<String> {
                #[derive(serde::Deserialize)]
                struct Spec {
                    #[serde(default, rename = "cpu")]
                    _cpu: Option<String>,
                }
                mcm_driver::go_decode::<Spec>(&class.provider_spec, "providerSpec")
                    .map(|d| d.unknown.iter().map(ToString::to_string).collect())
                    .unwrap_or_default()
            }
        }
        let class = |spec: serde_json::Value, secret: bool| {
            let mut c = json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineClass",
                "metadata": {"name": "c"},
                "providerSpec": spec,
            });
            if secret {
                c["secretRef"] = json!({"name": "s", "namespace": "ns"});
            }
            c
        };
        let strict = Strict;
        let ctx = Context {
            driver: &strict,
            target_cluster: true,
        };
        assert_eq!(
            problems(Kind::MachineClass, &class(json!({"cpu": "2"}), true), &ctx),
            vec![]
        );
        let p = problems(
            Kind::MachineClass,
            &class(json!({"cpu": "abc"}), false),
            &ctx,
        );
        assert_eq!(
            fields(&p),
            vec!["secretRef.name", "providerSpec.cpu"],
            "{p:?}"
        );
        // Keys the provider ignores are warnings, not problems (`CPU` is `cpu` to Go's
        // decoder).
        let spelled = class(json!({"CPU": "2", "cpus": "2"}), true);
        assert_eq!(problems(Kind::MachineClass, &spelled, &ctx), vec![]);
        assert_eq!(
            warnings(Kind::MachineClass, &spelled, &ctx),
            vec!["providerSpec.cpus: unknown field, ignored (did you mean cpu?)"]
        );
        let review = crate::webhook::review_request(
            &crate::webhook::tests::request("MachineClass", "CREATE", spelled),
            &ctx,
        );
        assert!(review.allowed);
        assert_eq!(
            review.warnings,
            Some(vec![
                "providerSpec.cpus: unknown field, ignored (did you mean cpu?)".to_string()
            ])
        );
        // The default of the SPI method accepts what the generic rules accept.
        let fake = FakeDriver::new();
        let lenient = Context {
            driver: &fake,
            target_cluster: true,
        };
        assert_eq!(
            problems(
                Kind::MachineClass,
                &class(json!({"cpu": "abc"}), true),
                &lenient
            ),
            vec![]
        );
    }

    #[test]
    fn label_syntax() {
        assert!(qualified_name("node.kubernetes.io/role").is_ok());
        assert!(qualified_name("worker").is_ok());
        assert!(qualified_name("Example.com/x").is_err());
        assert!(qualified_name("/x").is_err());
        assert!(qualified_name(&"a".repeat(64)).is_err());
        assert!(label_value("").is_ok());
        assert!(label_value("v1.2_3-x").is_ok());
        assert!(label_value("-x").is_err());
        assert!(Kind::parse("Pod").is_none());
        assert_eq!(Kind::parse("MachineSet"), Some(Kind::MachineSet));
    }
}
