//! The `ExecutionPlan` response schema the orchestrator sends: the plan's JSON schema with each
//! step's `capability` narrowed to an enum of the capabilities active in this turn, so a model
//! with native structured output cannot name anything else (validation still checks it).

use std::collections::BTreeMap;

use peregrine_llm::{ResponseSchema, schema_for};
use schemars::JsonSchema;
use serde_json::{Value, json};

/// The name the schema is sent under; logs, proxies and scripted test servers key on it.
pub const SCHEMA_NAME: &str = "ExecutionPlan";

// The shape of `peregrine_core::ExecutionPlan` as the model sees it (core types carry no
// schema). Container descriptions are set explicitly: doc comments would reach the model.
#[allow(dead_code, reason = "only its schema is used; answers are parsed into peregrine_core::ExecutionPlan")]
#[derive(JsonSchema)]
#[schemars(rename = "ExecutionPlan", description = "An execution plan: steps run in order.")]
struct PlanShape {
    /// The steps, run in order; the last one is `respond` or `clarify`.
    steps: Vec<StepShape>,
}

// A scalar step parameter: parameters are never lists or nested objects.
#[allow(dead_code, reason = "only its schema is used")]
#[derive(JsonSchema)]
#[schemars(description = "A string, number or boolean.")]
#[serde(untagged)]
enum ParameterValue {
    Text(String),
    Number(f64),
    Flag(bool),
}

// The shape of `peregrine_core::PlannedStep`.
#[allow(dead_code, reason = "only its schema is used")]
#[derive(JsonSchema)]
#[schemars(rename = "PlannedStep", description = "One step of the plan, run by one capability.")]
struct StepShape {
    /// Unique identifier of this step's output; later steps reference it in their inputs.
    context_key: String,
    /// The capability that runs this step.
    capability: String,
    /// Complete, self-sufficient description of what this step must accomplish.
    task_objective: String,
    /// Clear criteria for determining that the step succeeded.
    success_criteria: String,
    /// The context type the step produces (e.g. "CHANNEL_VALUES").
    expected_output: Option<String>,
    /// Step-specific settings; values are strings, numbers or booleans only.
    parameters: Option<BTreeMap<String, ParameterValue>>,
    /// Contexts the step reads, each one object {"CONTEXT_TYPE": "context_key"} naming existing context or an earlier step's context_key.
    inputs: Vec<BTreeMap<String, String>>,
}

/// The plan schema with `capability` restricted to `capability_names` (in the given order).
pub fn plan_schema(capability_names: &[String]) -> ResponseSchema {
    let mut schema = schema_for::<PlanShape>();
    schema.name = SCHEMA_NAME.into();
    restrict_capabilities(&mut schema.schema, capability_names);
    schema
}

/// Narrows the `capability` property of the step schema to an enum, wherever the generator put
/// the step schema: inline under `steps.items`, or behind a `$ref` into `$defs` /
/// `definitions`. Returns whether the property was found.
pub fn restrict_capabilities(schema: &mut Value, capability_names: &[String]) -> bool {
    let Some(step) = step_schema_mut(schema) else { return false };
    let Some(properties) = step.get_mut("properties").and_then(Value::as_object_mut) else { return false };
    let description = properties
        .get("capability")
        .and_then(|property| property.get("description"))
        .cloned()
        .unwrap_or_else(|| json!("The capability that runs this step."));
    properties.insert("capability".into(), json!({"type": "string", "enum": capability_names, "description": description}));
    true
}

/// The schema object describing one step.
fn step_schema_mut(schema: &mut Value) -> Option<&mut Value> {
    let items = schema.pointer("/properties/steps/items")?;
    let Some(reference) = items.get("$ref").and_then(Value::as_str) else {
        return schema.pointer_mut("/properties/steps/items");
    };
    // `#/$defs/PlannedStep` or `#/definitions/PlannedStep` → a JSON pointer into the root.
    let pointer = reference.strip_prefix('#')?.to_owned();
    schema.pointer_mut(&pointer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn capability_becomes_an_enum_of_the_given_names() {
        let schema = plan_schema(&names(&["python", "respond", "clarify"]));
        assert_eq!(schema.name, "ExecutionPlan");
        let mut root = schema.schema.clone();
        let step = step_schema_mut(&mut root).expect("step schema found").clone();
        assert_eq!(step["properties"]["capability"]["enum"], json!(["python", "respond", "clarify"]));
        assert_eq!(step["properties"]["capability"]["type"], "string");
        assert!(step["properties"]["capability"]["description"].as_str().is_some_and(|text| text.contains("capability")));
        let required: Vec<&str> = step["required"].as_array().expect("required list").iter().filter_map(Value::as_str).collect();
        for field in ["context_key", "capability", "task_objective", "success_criteria", "inputs"] {
            assert!(required.contains(&field), "{field} required: {required:?}");
        }
    }

    #[test]
    fn step_schemas_behind_refs_or_inline_are_both_patched() {
        let only = names(&["respond"]);
        for key in ["$defs", "definitions"] {
            let mut schema = json!({
                "type": "object",
                "properties": {"steps": {"type": "array", "items": {"$ref": format!("#/{key}/PlannedStep")}}},
                key: {"PlannedStep": {"type": "object", "properties": {"capability": {"type": "string"}}}}
            });
            assert!(restrict_capabilities(&mut schema, &only), "{key}");
            assert_eq!(schema[key]["PlannedStep"]["properties"]["capability"]["enum"], json!(["respond"]));
        }
        let mut inline = json!({"properties": {"steps": {"items": {"properties": {"capability": {"type": "string"}}}}}});
        assert!(restrict_capabilities(&mut inline, &only));
        assert_eq!(inline["properties"]["steps"]["items"]["properties"]["capability"]["enum"], json!(["respond"]));
        let mut unrelated = json!({"type": "object"});
        assert!(!restrict_capabilities(&mut unrelated, &only));
    }
}
