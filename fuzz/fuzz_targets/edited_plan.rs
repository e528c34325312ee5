//! An edited plan as a client sends it with an approval (JSON in any of the accepted shapes):
//! parsed into the plan type and validated against a fixed set of capabilities and one stored
//! context, as the orchestrator does with an edit; what parses is stored and read back the same,
//! and what validates validates again to itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use peregrine_agent::infra::orchestrator::pending::parse_plan;
use peregrine_core::{ContextEntry, ContextStore, ExecutionPlan, PlanValidationError, PlannedStep, validate_plan};
use serde_json::{Value, json};

const REGISTERED: [&str; 4] = ["respond", "clarify", "current_weather", "time_range_parsing"];

fn validate(plan: ExecutionPlan, existing: &ContextStore) -> Result<ExecutionPlan, PlanValidationError> {
    validate_plan(plan, "the task", |name| REGISTERED.contains(&name), || REGISTERED.map(str::to_owned).to_vec(), existing)
}

fuzz_target!(|body: &[u8]| {
    let Ok(edit) = serde_json::from_slice::<Value>(body) else { return };
    let Ok(plan) = parse_plan(edit) else { return };
    let stored = serde_json::to_value(&plan).expect("a plan serialises");
    assert_eq!(parse_plan(stored), Ok(plan.clone()), "a stored plan reads back the same");
    let mut existing = ContextStore::default();
    existing.insert("TIME_RANGE", "tr", ContextEntry::new(json!({"start": "now"}), None));
    match validate(plan, &existing) {
        Ok(valid) => {
            assert!(valid.steps.last().is_some_and(PlannedStep::is_terminal));
            assert!(valid.steps.iter().all(|step| REGISTERED.contains(&step.capability.as_str())));
            assert_eq!(validate(valid.clone(), &existing), Ok(valid), "validation is idempotent");
        }
        Err(error) => {
            let _ = (error.to_string(), error.classification());
        }
    }
});
