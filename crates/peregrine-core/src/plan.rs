//! Execution plans written by the orchestrator, and their validation: an empty plan becomes a
//! single respond step, unknown capabilities ask for re-classification, bad context references
//! ask for a new plan, and every plan ends in `respond` or `clarify`.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::context::ContextStore;
use crate::error::{ErrorClassification, ErrorSeverity};

/// A reference to a context entry a step reads: `{TYPE: key}` in plans.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InputRef {
    /// The context type, e.g. `CHANNEL_ADDRESSES`.
    pub context_type: String,
    /// The key the entry is stored under.
    pub key: String,
}

impl InputRef {
    /// A reference to `context_type` stored under `key`.
    pub fn new(context_type: impl Into<String>, key: impl Into<String>) -> Self {
        Self { context_type: context_type.into(), key: key.into() }
    }
}

impl fmt::Display for InputRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{\"{}\": \"{}\"}}", self.context_type, self.key)
    }
}

impl Serialize for InputRef {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(&self.context_type, &self.key)?;
        map.end()
    }
}

impl<'de> Deserialize<'de> for InputRef {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InputRefVisitor;
        impl<'de> Visitor<'de> for InputRefVisitor {
            type Value = InputRef;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object with exactly one entry {\"CONTEXT_TYPE\": \"context_key\"}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<InputRef, A::Error> {
                let Some((context_type, key)) = map.next_entry::<String, String>()? else {
                    return Err(de::Error::custom("an input reference is empty; expected {\"CONTEXT_TYPE\": \"context_key\"}"));
                };
                if map.next_key::<String>()?.is_some() {
                    return Err(de::Error::custom(
                        "an input reference names more than one context; write one {\"TYPE\": \"key\"} object per input",
                    ));
                }
                Ok(InputRef { context_type, key })
            }
        }
        deserializer.deserialize_map(InputRefVisitor)
    }
}

/// One step of an execution plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedStep {
    /// Key the step's output is stored under; later steps reference it.
    pub context_key: String,
    /// The capability that runs this step.
    pub capability: String,
    /// What this step must achieve.
    pub task_objective: String,
    /// How to tell the step succeeded.
    #[serde(default)]
    pub success_criteria: String,
    /// The context type or description of what the step produces.
    #[serde(default)]
    pub expected_output: Option<String>,
    /// Step parameters (strings, numbers, booleans).
    #[serde(default)]
    pub parameters: Option<serde_json::Map<String, Value>>,
    /// Contexts the step reads, in order.
    #[serde(default)]
    pub inputs: Vec<InputRef>,
}

impl PlannedStep {
    /// The generic final step appended when a plan does not end in respond or clarify.
    pub fn generic_respond(task: &str) -> Self {
        Self {
            context_key: "user_response".into(),
            capability: RESPOND.into(),
            task_objective: format!("Respond to user request: {task}"),
            success_criteria: "Provide helpful response to user query".into(),
            expected_output: Some("user_response".into()),
            parameters: None,
            inputs: Vec::new(),
        }
    }

    /// Whether this step ends the turn (respond or clarify).
    pub fn is_terminal(&self) -> bool {
        let capability = self.capability.to_lowercase();
        capability == RESPOND || capability == CLARIFY
    }
}

/// The name of the always-active capability that answers the user.
pub const RESPOND: &str = "respond";
/// The name of the always-active capability that asks the user for missing details.
pub const CLARIFY: &str = "clarify";

/// The orchestrator's plan: steps run in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecutionPlan {
    /// The steps.
    pub steps: Vec<PlannedStep>,
}

/// Why a plan was refused; each variant knows its recovery class.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanValidationError {
    /// The plan names capabilities that are not registered.
    #[error("the plan uses capabilities that do not exist: {}; registered: {}", names.join(", "), registered.join(", "))]
    HallucinatedCapabilities {
        /// The unknown names.
        names: Vec<String>,
        /// What is registered.
        registered: Vec<String>,
    },
    /// A step reads a context key that neither exists nor is produced by an earlier step.
    #[error("step {step} ({capability}) reads {input}, which does not exist; available keys: {}", format_available(available))]
    UnknownContextKey {
        /// Zero-based step index.
        step: usize,
        /// The step's capability.
        capability: String,
        /// The bad reference.
        input: InputRef,
        /// Keys the step could have used.
        available: Vec<String>,
    },
    /// A step reads a key that only a later step produces.
    #[error("step {step} ({capability}) reads {input}, which step {producer} produces later; reorder the steps so producers come first")]
    ForwardReference {
        /// Zero-based step index.
        step: usize,
        /// The step's capability.
        capability: String,
        /// The bad reference.
        input: InputRef,
        /// The later step producing it.
        producer: usize,
    },
    /// A step reads its own output.
    #[error("step {step} ({capability}) reads {input}, its own output; a step can only read what earlier steps or turns stored")]
    SelfReference {
        /// Zero-based step index.
        step: usize,
        /// The step's capability.
        capability: String,
        /// The bad reference.
        input: InputRef,
    },
}

fn format_available(available: &[String]) -> String {
    if available.is_empty() { "none".into() } else { available.join(", ") }
}

/// A plan that does not validate fails its node with the validation's classification.
impl From<PlanValidationError> for crate::capability::CapabilityError {
    fn from(error: PlanValidationError) -> Self {
        let classification = error.classification();
        Self::from_error(error).classified(classification)
    }
}

impl PlanValidationError {
    /// The severity the router acts on: unknown capabilities re-classify, bad references re-plan.
    pub fn severity(&self) -> ErrorSeverity {
        match self {
            Self::HallucinatedCapabilities { .. } => ErrorSeverity::Reclassification,
            Self::UnknownContextKey { .. } | Self::ForwardReference { .. } | Self::SelfReference { .. } => ErrorSeverity::Replanning,
        }
    }

    /// A classification carrying the full explanation for the next planning prompt.
    pub fn classification(&self) -> ErrorClassification {
        let message = match self {
            Self::HallucinatedCapabilities { .. } => "The plan used capabilities that are not available",
            _ => "The plan referenced context that is not available at that step",
        };
        ErrorClassification::new(self.severity(), message).with_metadata("technical_details", self.to_string())
    }
}

/// Validates and completes a plan (reference §2.4 step 5):
/// 1. an empty plan becomes one generic respond step;
/// 2. unknown capabilities → [`PlanValidationError::HallucinatedCapabilities`];
/// 3. every input must name an existing context or an earlier step's key (no forward or self
///    references);
/// 4. a plan not ending in respond/clarify gets the generic respond step appended.
pub fn validate_plan(
    mut plan: ExecutionPlan,
    task: &str,
    is_registered: impl Fn(&str) -> bool,
    registered_names: impl FnOnce() -> Vec<String>,
    existing: &ContextStore,
) -> Result<ExecutionPlan, PlanValidationError> {
    if plan.steps.is_empty() {
        plan.steps.push(PlannedStep::generic_respond(task));
        return Ok(plan);
    }
    let mut unknown: Vec<String> = Vec::new();
    for step in &plan.steps {
        if !is_registered(&step.capability) && !unknown.contains(&step.capability) {
            unknown.push(step.capability.clone());
        }
    }
    if !unknown.is_empty() {
        return Err(PlanValidationError::HallucinatedCapabilities { names: unknown, registered: registered_names() });
    }
    check_references(&plan, existing)?;
    if !plan.steps.last().is_some_and(PlannedStep::is_terminal) {
        plan.steps.push(PlannedStep::generic_respond(task));
    }
    Ok(plan)
}

fn check_references(plan: &ExecutionPlan, existing: &ContextStore) -> Result<(), PlanValidationError> {
    let mut produced_before: BTreeSet<&str> = BTreeSet::new();
    for (index, step) in plan.steps.iter().enumerate() {
        for input in &step.inputs {
            if existing.contains(&input.context_type, &input.key) || produced_before.contains(input.key.as_str()) {
                continue;
            }
            if input.key == step.context_key {
                return Err(PlanValidationError::SelfReference { step: index, capability: step.capability.clone(), input: input.clone() });
            }
            if let Some(producer) = plan.steps.iter().skip(index + 1).position(|later| later.context_key == input.key) {
                return Err(PlanValidationError::ForwardReference {
                    step: index,
                    capability: step.capability.clone(),
                    input: input.clone(),
                    producer: index + 1 + producer,
                });
            }
            let mut available: Vec<String> = existing.references().map(|reference| reference.to_string()).collect();
            available.extend(produced_before.iter().map(|key| format!("{key} (from an earlier step)")));
            return Err(PlanValidationError::UnknownContextKey {
                step: index,
                capability: step.capability.clone(),
                input: input.clone(),
                available,
            });
        }
        produced_before.insert(step.context_key.as_str());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::ContextEntry;

    fn step(key: &str, capability: &str, inputs: &[(&str, &str)]) -> PlannedStep {
        PlannedStep {
            context_key: key.into(),
            capability: capability.into(),
            task_objective: format!("run {capability}"),
            success_criteria: String::new(),
            expected_output: None,
            parameters: None,
            inputs: inputs.iter().map(|(t, k)| InputRef::new(*t, *k)).collect(),
        }
    }

    const REGISTERED: [&str; 6] = ["respond", "clarify", "python", "channel_finding", "channel_read", "time_range_parsing"];

    fn validate(steps: Vec<PlannedStep>, existing: &ContextStore) -> Result<ExecutionPlan, PlanValidationError> {
        validate_plan(
            ExecutionPlan { steps },
            "the task",
            |name| REGISTERED.contains(&name),
            || REGISTERED.iter().map(|s| s.to_string()).collect(),
            existing,
        )
    }

    fn capabilities(plan: &ExecutionPlan) -> Vec<&str> {
        plan.steps.iter().map(|s| s.capability.as_str()).collect()
    }

    #[test]
    fn acceptance_case_10_plan_validation_table() {
        let empty = ContextStore::default();
        let mut with_time = ContextStore::default();
        with_time.insert("TIME_RANGE", "tr_0101_0102", ContextEntry::new(serde_json::json!({"start": "a"}), None));

        let plan = validate(vec![], &empty).expect("empty plan is completed");
        assert_eq!(capabilities(&plan), ["respond"]);
        assert_eq!(plan.steps[0], PlannedStep::generic_respond("the task"));

        let plan = validate(vec![step("out", "python", &[])], &empty).expect("valid");
        assert_eq!(capabilities(&plan), ["python", "respond"]);

        let plan = validate(vec![step("q", "clarify", &[])], &empty).expect("valid");
        assert_eq!(capabilities(&plan), ["clarify"]);

        let error = validate(vec![step("x", "nonexistent", &[])], &empty).expect_err("unknown capability");
        assert_eq!(error.severity(), ErrorSeverity::Reclassification);
        assert!(matches!(&error, PlanValidationError::HallucinatedCapabilities { names, .. } if names == &["nonexistent"]));

        let error = validate(vec![step("x", "python", &[("DATA", "missing")])], &with_time).expect_err("missing key");
        assert_eq!(error.severity(), ErrorSeverity::Replanning);
        let message = error.to_string();
        assert!(message.contains("{\"DATA\": \"missing\"}"), "{message}");
        assert!(message.contains("{\"TIME_RANGE\": \"tr_0101_0102\"}"), "available keys listed: {message}");

        let error = validate(vec![step("a", "python", &[("CHANNEL_ADDRESSES", "b")]), step("b", "channel_finding", &[])], &empty)
            .expect_err("forward");
        assert!(matches!(error, PlanValidationError::ForwardReference { step: 0, producer: 1, .. }));
        assert_eq!(error.severity(), ErrorSeverity::Replanning);

        let error = validate(vec![step("a", "python", &[("PYTHON_RESULTS", "a")])], &empty).expect_err("self");
        assert!(matches!(error, PlanValidationError::SelfReference { step: 0, .. }));

        let plan = validate(vec![step("r", "python", &[("TIME_RANGE", "tr_0101_0102")])], &with_time).expect("existing context is fine");
        assert_eq!(capabilities(&plan), ["python", "respond"]);

        let plan = validate(
            vec![
                step("a", "channel_finding", &[]),
                step("b", "channel_read", &[("CHANNEL_ADDRESSES", "a")]),
                step("c", "respond", &[("CHANNEL_VALUES", "b")]),
            ],
            &empty,
        )
        .expect("chained");
        assert_eq!(capabilities(&plan), ["channel_finding", "channel_read", "respond"]);
    }

    #[test]
    fn classification_carries_the_explanation() {
        let error = PlanValidationError::UnknownContextKey {
            step: 0,
            capability: "python".into(),
            input: InputRef::new("DATA", "x"),
            available: vec![],
        };
        let classification = error.classification();
        assert_eq!(classification.severity, ErrorSeverity::Replanning);
        assert!(classification.format_for_llm().contains("available keys: none"));
    }

    #[test]
    fn input_refs_use_the_single_entry_object_form() {
        let parsed: PlannedStep = serde_json::from_value(serde_json::json!({
            "context_key": "k", "capability": "python", "task_objective": "t",
            "inputs": [{"TIME_RANGE": "tr"}]
        }))
        .expect("valid step");
        assert_eq!(parsed.inputs, vec![InputRef::new("TIME_RANGE", "tr")]);
        assert_eq!(serde_json::to_value(&parsed.inputs).expect("serializes"), serde_json::json!([{"TIME_RANGE": "tr"}]));
        let two = serde_json::from_value::<InputRef>(serde_json::json!({"A": "a", "B": "b"}));
        assert!(two.expect_err("two entries refused").to_string().contains("more than one context"));
        assert!(serde_json::from_value::<InputRef>(serde_json::json!({})).is_err());
    }

    /// Plans over a few names and keys, so that every validation outcome comes up often.
    fn small_plan() -> impl proptest::strategy::Strategy<Value = Vec<PlannedStep>> {
        use proptest::prelude::*;
        let key = prop::sample::select(vec!["a", "b", "c", "tr_0101_0102"]);
        let input = (prop::sample::select(vec!["TIME_RANGE", "DATA"]), key.clone());
        let capability = prop::sample::select(vec!["python", "channel_read", "respond", "clarify", "Respond", "ghost"]);
        let planned =
            (key, capability, prop::collection::vec(input, 0..3)).prop_map(|(key, capability, inputs)| step(key, capability, &inputs));
        prop::collection::vec(planned, 0..6)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        #[test]
        fn validation_completes_a_plan_or_names_a_real_fault(steps in small_plan()) {
            let mut existing = ContextStore::default();
            existing.insert("TIME_RANGE", "tr_0101_0102", ContextEntry::new(serde_json::json!({"start": "a"}), None));
            match validate(steps.clone(), &existing) {
                Ok(plan) => {
                    proptest::prop_assert!(plan.steps.starts_with(&steps), "steps are kept, in order");
                    proptest::prop_assert!(plan.steps.len() <= steps.len() + 1);
                    proptest::prop_assert!(plan.steps.last().is_some_and(PlannedStep::is_terminal));
                    proptest::prop_assert_eq!(validate(plan.steps.clone(), &existing), Ok(plan), "idempotent");
                }
                Err(PlanValidationError::HallucinatedCapabilities { names, registered }) => {
                    proptest::prop_assert!(!names.is_empty() && names.iter().all(|name| !REGISTERED.contains(&name.as_str())));
                    proptest::prop_assert!(names.iter().all(|name| steps.iter().any(|step| &step.capability == name)));
                    proptest::prop_assert_eq!(registered.len(), REGISTERED.len());
                }
                Err(PlanValidationError::SelfReference { step, input, .. }) => {
                    proptest::prop_assert_eq!(&input.key, &steps[step].context_key);
                    proptest::prop_assert!(!existing.contains(&input.context_type, &input.key));
                }
                Err(PlanValidationError::ForwardReference { step, input, producer, .. }) => {
                    proptest::prop_assert!(producer > step && steps[producer].context_key == input.key);
                    proptest::prop_assert!(steps[..step].iter().all(|earlier| earlier.context_key != input.key));
                }
                Err(PlanValidationError::UnknownContextKey { step, input, .. }) => {
                    proptest::prop_assert!(steps.iter().all(|any| any.context_key != input.key), "step {step} reads what no step writes");
                    proptest::prop_assert!(!existing.contains(&input.context_type, &input.key));
                }
            }
        }
    }
}
