//! Pending plans of planning mode, on disk: `pending_execution_plan.json` (the plan awaiting
//! approval, with `__metadata__`) and `modified_execution_plan.json` (an edited plan written by
//! a plan editor), in one folder **per thread**
//! (`<agent_data_dir>/execution_plans/pending_plans/<thread>/`), so two conversations never
//! overwrite each other's plan as upstream's single global file did.

use std::io;
use std::path::{Path, PathBuf};

use peregrine_core::ExecutionPlan;
use serde_json::{Value, json};

/// The plan awaiting approval.
pub const PENDING_FILE: &str = "pending_execution_plan.json";
/// An edited plan to use instead, when present at approval time.
pub const MODIFIED_FILE: &str = "modified_execution_plan.json";

/// The pending-plan folder of one thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPlans {
    dir: PathBuf,
}

/// What goes into `__metadata__`.
pub struct PlanMetadata<'a> {
    /// The task planned.
    pub current_task: &'a str,
    /// The user's message.
    pub original_query: &'a str,
    /// The thread.
    pub thread_id: &'a str,
    /// When the plan was made (RFC 3339).
    pub created_at: String,
}

impl PendingPlans {
    /// The folder for `thread_id` under `agent_data_dir`.
    pub fn for_thread(agent_data_dir: &Path, thread_id: &str) -> Self {
        Self { dir: agent_data_dir.join("execution_plans").join("pending_plans").join(folder_name(thread_id)) }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pending plan's path.
    pub fn pending_path(&self) -> PathBuf {
        self.dir.join(PENDING_FILE)
    }

    /// The edited plan's path.
    pub fn modified_path(&self) -> PathBuf {
        self.dir.join(MODIFIED_FILE)
    }

    /// Writes the pending plan (atomically: a reader never sees half a file) and removes any
    /// stale edited plan, which belonged to an older plan. Returns the pending plan's path.
    pub fn save(&self, plan: &ExecutionPlan, metadata: &PlanMetadata<'_>) -> Result<PathBuf, (PathBuf, io::Error)> {
        std::fs::create_dir_all(&self.dir).map_err(|error| (self.dir.clone(), error))?;
        remove_if_present(&self.modified_path()).map_err(|error| (self.modified_path(), error))?;
        let steps = serde_json::to_value(&plan.steps).map_err(|error| (self.pending_path(), io::Error::other(error)))?;
        let document = json!({
            "__metadata__": {
                "current_task": metadata.current_task,
                "original_query": metadata.original_query,
                "thread_id": metadata.thread_id,
                "created_at": metadata.created_at,
                "serialization_type": "pending_execution_plan",
            },
            "steps": steps,
        });
        let text = serde_json::to_string_pretty(&document).map_err(|error| (self.pending_path(), io::Error::other(error)))?;
        let path = self.pending_path();
        let partial = self.dir.join(format!("{PENDING_FILE}.partial"));
        std::fs::write(&partial, text).map_err(|error| (partial.clone(), error))?;
        std::fs::rename(&partial, &path).map_err(|error| (path.clone(), error))?;
        Ok(path)
    }

    /// The edited plan file as JSON, if a plan editor wrote one (`Ok(None)` when absent). Text
    /// that is not JSON comes back as a JSON string, so validation reports it as an unusable
    /// edit instead of it being ignored.
    pub fn load_modified_value(&self) -> Result<Option<Value>, String> {
        let path = self.modified_path();
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(serde_json::from_str(&text).unwrap_or(Value::String(text)))),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(format!("cannot read {}: {error}", path.display())),
        }
    }

    /// Removes both files and, when empty, the folder. Failures are reported, not fatal: the
    /// next [`PendingPlans::save`] clears a stale edited plan anyway.
    pub fn clear(&self) -> Vec<(PathBuf, io::Error)> {
        let mut failures = Vec::new();
        for path in [self.pending_path(), self.modified_path()] {
            if let Err(error) = remove_if_present(&path) {
                failures.push((path, error));
            }
        }
        // Fails harmlessly when something else is still in the folder.
        let _ = std::fs::remove_dir(&self.dir);
        failures
    }
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// A plan from untrusted JSON: `{"steps": [...]}` (extra keys such as `__metadata__` ignored),
/// `{"execution_plan": {"steps": [...]}}`, or a bare list of steps.
pub fn parse_plan(value: Value) -> Result<ExecutionPlan, String> {
    let value = match value {
        Value::Object(mut object) if !object.contains_key("steps") && object.contains_key("execution_plan") => {
            object.remove("execution_plan").unwrap_or(Value::Null)
        }
        Value::Array(steps) => json!({ "steps": steps }),
        other => other,
    };
    if value.get("steps").is_none() {
        return Err("expected an execution plan {\"steps\": [...]}".into());
    }
    serde_json::from_value::<ExecutionPlan>(value).map_err(|error| format!("not a valid execution plan: {error}"))
}

/// A folder name for a thread id: the id itself when it is a plain name, otherwise its safe
/// characters plus a stable hash, so distinct ids never share a folder and no id escapes the
/// pending-plans folder.
pub fn folder_name(thread_id: &str) -> String {
    let plain = !thread_id.is_empty()
        && thread_id.len() <= 100
        && !thread_id.starts_with('.')
        && thread_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if plain {
        return thread_id.to_owned();
    }
    let safe: String =
        thread_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).take(64).collect();
    format!("{safe}-{:016x}", fnv1a(thread_id.as_bytes()))
}

/// FNV-1a, 64 bit: stable across builds and platforms (unlike the std hasher).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use peregrine_core::PlannedStep;

    use super::*;

    #[test]
    fn thread_ids_map_to_distinct_safe_folders() {
        assert_eq!(folder_name("thread-1"), "thread-1");
        let slash = folder_name("a/b");
        let underscore = folder_name("a_b");
        assert_ne!(slash, underscore);
        assert!(slash.starts_with("a_b-") && !slash.contains('/'));
        for hostile in ["..", ".", "", "../../etc", "a\\b"] {
            let name = folder_name(hostile);
            assert!(!name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\']), "{hostile:?} → {name:?}");
        }
        assert_eq!(folder_name("a/b"), slash, "stable");
    }

    #[test]
    fn save_load_and_clear_round_trip() {
        let dir = tempfile::tempdir().expect("temp dir");
        let pending = PendingPlans::for_thread(dir.path(), "t1");
        let plan = ExecutionPlan { steps: vec![PlannedStep::generic_respond("hi")] };
        let metadata = PlanMetadata { current_task: "hi", original_query: "hi!", thread_id: "t1", created_at: "now".into() };
        std::fs::create_dir_all(pending.dir()).expect("dir");
        std::fs::write(pending.modified_path(), "{}").expect("stale edit");
        let path = pending.save(&plan, &metadata).expect("saved");
        assert_eq!(path, dir.path().join("execution_plans/pending_plans/t1/pending_execution_plan.json"));
        assert!(!pending.modified_path().exists(), "a stale edited plan is removed when a new plan is saved");
        let saved: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        assert_eq!(saved["__metadata__"]["serialization_type"], "pending_execution_plan");
        assert_eq!(saved["__metadata__"]["original_query"], "hi!");
        assert_eq!(parse_plan(saved).expect("the saved file is a plan"), plan);
        assert_eq!(pending.load_modified_value(), Ok(None));
        std::fs::write(pending.modified_path(), "not json").expect("write");
        assert_eq!(pending.load_modified_value(), Ok(Some(Value::String("not json".into()))), "kept, so it is refused, not ignored");
        std::fs::remove_file(pending.modified_path()).expect("remove");
        std::fs::create_dir(pending.modified_path()).expect("a directory where the file should be");
        assert!(pending.load_modified_value().expect_err("unreadable").contains("modified_execution_plan.json"));
        std::fs::remove_dir(pending.modified_path()).expect("remove");
        assert!(pending.clear().is_empty());
        assert!(!pending.dir().exists());
    }

    #[test]
    fn plans_parse_from_the_accepted_shapes() {
        let step = json!({"context_key": "r", "capability": "respond", "task_objective": "answer"});
        for shape in [json!({"steps": [step.clone()]}), json!({"execution_plan": {"steps": [step.clone()]}}), json!([step.clone()])] {
            assert_eq!(parse_plan(shape).expect("parses").steps.len(), 1);
        }
        assert!(parse_plan(json!({"plan": []})).is_err());
        assert!(
            parse_plan(json!({"steps": [{"capability": "respond"}]})).expect_err("missing fields").contains("not a valid execution plan")
        );
    }

    /// An edited plan as a client may send it: a plan in one of the accepted shapes whose steps
    /// use a few capability names and context keys (so references are often valid, forward,
    /// self or unknown), with fields of any type now and then.
    fn edited_plan() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let anything = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i32>().prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::from)
        ];
        let name = prop::sample::select(vec!["respond", "clarify", "current_weather", "RESPOND", "unknown", ""]);
        let key = prop::sample::select(vec!["a", "b", "c", "tr", "user_response"]);
        let input = prop_oneof![
            6 => (prop::sample::select(vec!["TIME_RANGE", "CURRENT_WEATHER"]), key.clone()).prop_map(|(kind, key)| json!({kind: key})),
            1 => Just(json!({})),
            1 => Just(json!({"A": "a", "B": "b"})),
            1 => anything.clone(),
        ];
        let field = |value: BoxedStrategy<Value>| prop::option::weighted(0.9, value);
        let step = (
            field(prop_oneof![6 => key.prop_map(Value::from), 1 => anything.clone()].boxed()),
            field(prop_oneof![6 => name.prop_map(Value::from), 1 => anything.clone()].boxed()),
            field(prop_oneof![6 => "\\PC{0,12}".prop_map(Value::from), 1 => anything.clone()].boxed()),
            prop::option::of(anything.clone()),
            prop::option::of(prop_oneof![Just(json!({"location": "Prague", "days": 2})), anything.clone()]),
            prop::option::of(prop_oneof![4 => prop::collection::vec(input, 0..3).prop_map(Value::from), 1 => anything.clone()]),
        )
            .prop_map(|(context_key, capability, objective, expected, parameters, inputs)| {
                let mut step = json!({});
                for (name, value) in [
                    ("context_key", context_key),
                    ("capability", capability),
                    ("task_objective", objective),
                    ("expected_output", expected),
                    ("parameters", parameters),
                    ("inputs", inputs),
                ] {
                    if let Some(value) = value {
                        step[name] = value;
                    }
                }
                step
            });
        (prop::collection::vec(step, 0..5), 0..4u8, anything).prop_map(|(steps, shape, other)| match shape {
            0 => json!({"steps": steps}),
            1 => json!({"execution_plan": {"steps": steps}}),
            2 => Value::from(steps),
            _ => json!({"steps": steps, "note": other}),
        })
    }

    const REGISTERED: [&str; 3] = ["respond", "clarify", "current_weather"];

    fn validate(
        plan: ExecutionPlan,
        existing: &peregrine_core::ContextStore,
    ) -> Result<ExecutionPlan, peregrine_core::PlanValidationError> {
        peregrine_core::validate_plan(
            plan,
            "the task",
            |name| REGISTERED.contains(&name),
            || REGISTERED.map(str::to_owned).to_vec(),
            existing,
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        #[test]
        fn an_edited_plan_is_parsed_and_validated_or_refused(edit in edited_plan()) {
            let Ok(plan) = parse_plan(edit) else { return Ok(()) };
            // What is stored (checkpoints, the pending file) reads back as the same plan.
            let stored = serde_json::to_value(&plan).expect("a plan serialises");
            proptest::prop_assert_eq!(parse_plan(stored), Ok(plan.clone()));
            let mut existing = peregrine_core::ContextStore::default();
            existing.insert("TIME_RANGE", "tr", peregrine_core::ContextEntry::new(json!({"start": "now"}), None));
            match validate(plan, &existing) {
                Ok(valid) => {
                    proptest::prop_assert!(valid.steps.last().is_some_and(PlannedStep::is_terminal));
                    proptest::prop_assert!(valid.steps.iter().all(|step| REGISTERED.contains(&step.capability.as_str())));
                    proptest::prop_assert_eq!(validate(valid.clone(), &existing), Ok(valid), "validation is idempotent");
                }
                Err(peregrine_core::PlanValidationError::HallucinatedCapabilities { names, .. }) => {
                    proptest::prop_assert!(!names.is_empty() && names.iter().all(|name| !REGISTERED.contains(&name.as_str())));
                }
                Err(error) => proptest::prop_assert_eq!(error.severity(), peregrine_core::ErrorSeverity::Replanning),
            }
        }
    }
}
