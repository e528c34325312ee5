//! The typed capability context store `{TYPE: {key: value + meta}}` that capabilities exchange
//! data through: merge at (type, key) granularity, typed access, step-input extraction with
//! hard/soft constraints and single/multiple cardinality, and bounded summaries for prompts.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::plan::{InputRef, PlannedStep};

/// A context type a capability can store: a serde value with a registered type name.
pub trait ContextType: Serialize + DeserializeOwned {
    /// The type name used in plans and the store, e.g. `TIME_RANGE`.
    const CONTEXT_TYPE: &'static str;
    /// `COMPUTATIONAL_DATA`, `METADATA` or `CONTEXTUAL_KNOWLEDGE`.
    const CONTEXT_CATEGORY: &'static str;

    /// How generated code reaches this value, e.g. `{"access_pattern": "context.TIME_RANGE.<key>.start"}`.
    fn access_details(&self, key: &str) -> Value {
        serde_json::json!({ "access_pattern": format!("context.{}.{key}", Self::CONTEXT_TYPE) })
    }

    /// What response and orchestrator prompts see; bounded by [`summarize`] by default.
    fn summary(&self) -> Value {
        summarize(&serde_json::to_value(self).unwrap_or(Value::Null))
    }
}

/// Metadata kept beside each stored value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContextMeta {
    /// The objective of the step that stored it (shown in the planner's AVAILABLE CONTEXT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_objective: Option<String>,
}

/// One stored value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextEntry {
    /// The value as stored by its capability.
    pub data: Value,
    /// Metadata.
    #[serde(default)]
    pub meta: ContextMeta,
    /// A summary computed by the typed context when stored; [`summarize`] of `data` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Value>,
}

impl ContextEntry {
    /// An entry with raw data.
    pub fn new(data: Value, task_objective: Option<String>) -> Self {
        Self { data, meta: ContextMeta { task_objective }, summary: None }
    }

    /// The summary prompts see.
    pub fn summary(&self) -> Value {
        self.summary.clone().unwrap_or_else(|| summarize(&self.data))
    }
}

/// Problems reading or writing the context store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContextError {
    /// A step input names an entry that is not stored.
    #[error("context {context_type}.{key} not found; stored: {}", list_or_none(available))]
    NotFound {
        /// The type asked for.
        context_type: String,
        /// The key asked for.
        key: String,
        /// What is stored, as `TYPE.key`.
        available: Vec<String>,
    },
    /// Required context types are missing from the step's inputs.
    #[error("step '{step}' needs context of type {} but its inputs provide {}", missing.join(" and "), list_or_none(provided))]
    MissingRequired {
        /// The step's context key.
        step: String,
        /// Types that are required and absent.
        missing: Vec<String>,
        /// Types the inputs do provide.
        provided: Vec<String>,
    },
    /// A type required once was given several times.
    #[error("step '{step}' must receive exactly one {context_type} but its inputs name {count}; pass a single {context_type} input")]
    Cardinality {
        /// The step's context key.
        step: String,
        /// The type.
        context_type: String,
        /// How many inputs of that type the step names.
        count: usize,
    },
    /// A stored value does not have the shape of its registered type.
    #[error("context {context_type}.{key} does not have the shape of {context_type}: {reason}")]
    Shape {
        /// The type.
        context_type: String,
        /// The key.
        key: String,
        /// The decoder's complaint.
        reason: String,
    },
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() { "none".into() } else { items.join(", ") }
}

/// How many entries of a type a capability takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cardinality {
    /// Exactly one entry.
    Single,
    /// One or more entries, always handed over as a list.
    Multiple,
}

/// A context type a capability needs, with an optional cardinality.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirement {
    /// The context type.
    pub context_type: String,
    /// Single or multiple; unconstrained when absent.
    pub cardinality: Option<Cardinality>,
}

impl Requirement {
    /// Any number of entries of `context_type`.
    pub fn any(context_type: impl Into<String>) -> Self {
        Self { context_type: context_type.into(), cardinality: None }
    }

    /// Exactly one entry of `context_type`.
    pub fn single(context_type: impl Into<String>) -> Self {
        Self { context_type: context_type.into(), cardinality: Some(Cardinality::Single) }
    }

    /// One or more entries of `context_type`.
    pub fn multiple(context_type: impl Into<String>) -> Self {
        Self { context_type: context_type.into(), cardinality: Some(Cardinality::Multiple) }
    }
}

/// Whether every required type must be present (`Hard`) or at least one (`Soft`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ConstraintMode {
    /// All required types must be present.
    #[default]
    Hard,
    /// At least one required type must be present.
    Soft,
}

/// The store: `{TYPE: {key: entry}}`, persistent across turns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ContextStore {
    entries: BTreeMap<String, BTreeMap<String, ContextEntry>>,
}

impl ContextStore {
    /// Stores one entry, replacing any entry with the same type and key.
    pub fn insert(&mut self, context_type: impl Into<String>, key: impl Into<String>, entry: ContextEntry) {
        self.entries.entry(context_type.into()).or_default().insert(key.into(), entry);
    }

    /// Stores a typed value, computing its summary.
    pub fn set<T: ContextType>(&mut self, key: impl Into<String>, value: &T, task_objective: Option<String>) -> Result<(), ContextError> {
        let key = key.into();
        let data = serde_json::to_value(value).map_err(|error| ContextError::Shape {
            context_type: T::CONTEXT_TYPE.into(),
            key: key.clone(),
            reason: error.to_string(),
        })?;
        let entry = ContextEntry { data, meta: ContextMeta { task_objective }, summary: Some(value.summary()) };
        self.insert(T::CONTEXT_TYPE, key, entry);
        Ok(())
    }

    /// Reads a typed value; `Ok(None)` when absent, an error when it has the wrong shape.
    pub fn get<T: ContextType>(&self, key: &str) -> Result<Option<T>, ContextError> {
        let Some(entry) = self.entry(T::CONTEXT_TYPE, key) else { return Ok(None) };
        decode(T::CONTEXT_TYPE, key, entry).map(Some)
    }

    /// The raw entry.
    pub fn entry(&self, context_type: &str, key: &str) -> Option<&ContextEntry> {
        self.entries.get(context_type)?.get(key)
    }

    /// Whether an entry exists.
    pub fn contains(&self, context_type: &str, key: &str) -> bool {
        self.entry(context_type, key).is_some()
    }

    /// Whether any entry of a type exists.
    pub fn has_type(&self, context_type: &str) -> bool {
        self.entries.get(context_type).is_some_and(|keys| !keys.is_empty())
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.values().all(BTreeMap::is_empty)
    }

    /// All entries of a type, by key.
    pub fn all_of_type(&self, context_type: &str) -> impl Iterator<Item = (&str, &ContextEntry)> {
        self.entries.get(context_type).into_iter().flat_map(|keys| keys.iter().map(|(key, entry)| (key.as_str(), entry)))
    }

    /// Every stored reference, sorted by type then key.
    pub fn references(&self) -> impl Iterator<Item = InputRef> + '_ {
        self.entries.iter().flat_map(|(context_type, keys)| keys.keys().map(move |key| InputRef::new(context_type.clone(), key.clone())))
    }

    /// Every entry with its reference.
    pub fn iter(&self) -> impl Iterator<Item = (InputRef, &ContextEntry)> {
        self.entries
            .iter()
            .flat_map(|(context_type, keys)| keys.iter().map(move |(key, entry)| (InputRef::new(context_type.clone(), key.clone()), entry)))
    }

    /// Merges `other` in at (type, key) granularity: new keys are added, the same key is replaced.
    pub fn merge(&mut self, other: ContextStore) {
        for (context_type, keys) in other.entries {
            self.entries.entry(context_type).or_default().extend(keys);
        }
    }

    /// Resolves a step's inputs (reference §1.7 `extract_from_step`) and checks them against the
    /// capability's requirements.
    pub fn extract_from_step(
        &self,
        step: &PlannedStep,
        requirements: &[Requirement],
        mode: ConstraintMode,
    ) -> Result<ExtractedContexts, ContextError> {
        let mut extracted = ExtractedContexts::default();
        for input in &step.inputs {
            let entry = self.entry(&input.context_type, &input.key).ok_or_else(|| ContextError::NotFound {
                context_type: input.context_type.clone(),
                key: input.key.clone(),
                available: self.references().map(|r| format!("{}.{}", r.context_type, r.key)).collect(),
            })?;
            extracted.by_type.entry(input.context_type.clone()).or_default().push((input.key.clone(), entry.clone()));
        }
        if requirements.is_empty() {
            return Ok(extracted);
        }
        let missing: Vec<String> =
            requirements.iter().filter(|r| !extracted.by_type.contains_key(&r.context_type)).map(|r| r.context_type.clone()).collect();
        let all_missing = missing.len() == requirements.len();
        if (mode == ConstraintMode::Hard && !missing.is_empty()) || (mode == ConstraintMode::Soft && all_missing) {
            return Err(ContextError::MissingRequired {
                step: step.context_key.clone(),
                missing,
                provided: extracted.by_type.keys().cloned().collect(),
            });
        }
        for requirement in requirements {
            let count = extracted.by_type.get(&requirement.context_type).map_or(0, Vec::len);
            if requirement.cardinality == Some(Cardinality::Single) && count > 1 {
                return Err(ContextError::Cardinality {
                    step: step.context_key.clone(),
                    context_type: requirement.context_type.clone(),
                    count,
                });
            }
        }
        Ok(extracted)
    }

    /// Summaries for prompts: of the step's inputs only when a step is given (nothing when it has
    /// no inputs), of everything otherwise.
    pub fn summaries(&self, step: Option<&PlannedStep>) -> Vec<(InputRef, Value)> {
        match step {
            Some(step) => step
                .inputs
                .iter()
                .filter_map(|input| self.entry(&input.context_type, &input.key).map(|entry| (input.clone(), entry.summary())))
                .collect(),
            None => self.iter().map(|(reference, entry)| (reference, entry.summary())).collect(),
        }
    }

    /// The step's input summaries as prompt lines, `- {TYPE: key}: summary` each; empty when it
    /// has none.
    pub fn summary_lines(&self, step: &PlannedStep) -> String {
        self.summaries(Some(step))
            .into_iter()
            .map(|(reference, summary)| format!("- {reference}: {summary}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn decode<T: DeserializeOwned>(context_type: &str, key: &str, entry: &ContextEntry) -> Result<T, ContextError> {
    serde_json::from_value(entry.data.clone()).map_err(|error| ContextError::Shape {
        context_type: context_type.into(),
        key: key.into(),
        reason: error.to_string(),
    })
}

/// A step's resolved inputs, grouped by type in input order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExtractedContexts {
    by_type: BTreeMap<String, Vec<(String, ContextEntry)>>,
}

impl ExtractedContexts {
    /// The single typed value of `T`, if the step has exactly one.
    pub fn single<T: ContextType>(&self) -> Result<Option<T>, ContextError> {
        match self.by_type.get(T::CONTEXT_TYPE).map(Vec::as_slice) {
            None | Some([]) => Ok(None),
            Some([(key, entry)]) => decode(T::CONTEXT_TYPE, key, entry).map(Some),
            Some(many) => Err(ContextError::Cardinality { step: String::new(), context_type: T::CONTEXT_TYPE.into(), count: many.len() }),
        }
    }

    /// Every typed value of `T`, in input order.
    pub fn multiple<T: ContextType>(&self) -> Result<Vec<T>, ContextError> {
        self.by_type
            .get(T::CONTEXT_TYPE)
            .map_or(Ok(Vec::new()), |entries| entries.iter().map(|(key, entry)| decode(T::CONTEXT_TYPE, key, entry)).collect())
    }

    /// Raw entries of a type.
    pub fn entries(&self, context_type: &str) -> &[(String, ContextEntry)] {
        self.by_type.get(context_type).map_or(&[], Vec::as_slice)
    }

    /// The types present.
    pub fn types(&self) -> impl Iterator<Item = &str> {
        self.by_type.keys().map(String::as_str)
    }
}

/// Bounds a value for prompts (reference §1.7): below depth 3 nested values are elided; lists
/// over 10 items keep 3 plus a marker; objects over 10 keys keep 3; strings over 200 characters
/// keep 100 plus their length.
pub fn summarize(value: &Value) -> Value {
    summarize_at(value, 0)
}

const MAX_DEPTH: usize = 3;

fn summarize_at(value: &Value, depth: usize) -> Value {
    match value {
        Value::String(text) if text.chars().count() > 200 => {
            let head: String = text.chars().take(100).collect();
            Value::String(format!("{head}... (truncated from {} chars)", text.chars().count()))
        }
        Value::Array(items) if depth >= MAX_DEPTH => Value::String(format!("[{} items]", items.len())),
        Value::Object(map) if depth >= MAX_DEPTH => Value::String(format!("{{{} keys}}", map.len())),
        Value::Array(items) if items.len() > 10 => {
            let mut kept: Vec<Value> = items.iter().take(3).map(|item| summarize_at(item, depth + 1)).collect();
            kept.push(Value::String(format!("...(truncated, {} items in total)", items.len())));
            Value::Array(kept)
        }
        Value::Array(items) => Value::Array(items.iter().map(|item| summarize_at(item, depth + 1)).collect()),
        Value::Object(map) if map.len() > 10 => {
            let mut kept: serde_json::Map<String, Value> =
                map.iter().take(3).map(|(k, v)| (k.clone(), summarize_at(v, depth + 1))).collect();
            kept.insert("...".into(), Value::String(format!("(truncated, {} keys in total)", map.len())));
            Value::Object(kept)
        }
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), summarize_at(v, depth + 1))).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct TimeRange {
        start: String,
        end: String,
    }

    impl ContextType for TimeRange {
        const CONTEXT_TYPE: &'static str = "TIME_RANGE";
        const CONTEXT_CATEGORY: &'static str = "METADATA";
    }

    fn entry(value: Value) -> ContextEntry {
        ContextEntry::new(value, None)
    }

    fn step_with(inputs: &[(&str, &str)]) -> PlannedStep {
        PlannedStep {
            context_key: "step".into(),
            capability: "python".into(),
            task_objective: "t".into(),
            success_criteria: String::new(),
            expected_output: None,
            parameters: None,
            inputs: inputs.iter().map(|(t, k)| InputRef::new(*t, *k)).collect(),
        }
    }

    #[test]
    fn acceptance_case_18_context_merge_granularity() {
        let mut store = ContextStore::default();
        store.insert("A", "k1", entry(json!(1)));
        let mut other = ContextStore::default();
        other.insert("A", "k2", entry(json!(2)));
        store.merge(other);
        assert!(store.contains("A", "k1") && store.contains("A", "k2"));
        let mut replacement = ContextStore::default();
        replacement.insert("A", "k1", entry(json!({"new": true})));
        store.merge(replacement);
        assert_eq!(store.entry("A", "k1").map(|e| &e.data), Some(&json!({"new": true})));
        assert_eq!(store.entry("A", "k2").map(|e| &e.data), Some(&json!(2)));
    }

    #[test]
    fn acceptance_case_19_extraction_constraints() {
        let mut store = ContextStore::default();
        store.insert("TIME_RANGE", "a", entry(json!({"start": "1", "end": "2"})));
        store.insert("TIME_RANGE", "b", entry(json!({"start": "3", "end": "4"})));
        store.insert("CHANNEL_ADDRESSES", "c", entry(json!(["X"])));

        let two_ranges = step_with(&[("TIME_RANGE", "a"), ("TIME_RANGE", "b")]);
        let error =
            store.extract_from_step(&two_ranges, &[Requirement::single("TIME_RANGE")], ConstraintMode::Hard).expect_err("cardinality");
        assert!(matches!(error, ContextError::Cardinality { count: 2, .. }));
        let both =
            store.extract_from_step(&two_ranges, &[Requirement::multiple("TIME_RANGE")], ConstraintMode::Hard).expect("multiple is fine");
        assert_eq!(both.multiple::<TimeRange>().expect("decodes").len(), 2);

        let one_range = step_with(&[("TIME_RANGE", "a")]);
        let requirements = [Requirement::single("TIME_RANGE"), Requirement::any("CHANNEL_ADDRESSES")];
        let error = store.extract_from_step(&one_range, &requirements, ConstraintMode::Hard).expect_err("hard mode needs both");
        assert!(matches!(&error, ContextError::MissingRequired { missing, .. } if missing == &["CHANNEL_ADDRESSES"]));
        let soft = store.extract_from_step(&one_range, &requirements, ConstraintMode::Soft).expect("soft mode needs one");
        assert_eq!(soft.single::<TimeRange>().expect("decodes"), Some(TimeRange { start: "1".into(), end: "2".into() }));
        let nothing = step_with(&[]);
        assert!(store.extract_from_step(&nothing, &requirements, ConstraintMode::Soft).is_err());

        let error = store.extract_from_step(&step_with(&[("TIME_RANGE", "zzz")]), &[], ConstraintMode::Hard).expect_err("missing key");
        assert!(error.to_string().contains("TIME_RANGE.a"), "lists what is stored: {error}");
    }

    #[test]
    fn typed_values_round_trip_and_wrong_shapes_are_reported() {
        let mut store = ContextStore::default();
        let range = TimeRange { start: "s".into(), end: "e".into() };
        store.set("tr", &range, Some("parse".into())).expect("stores");
        assert_eq!(store.get::<TimeRange>("tr").expect("decodes"), Some(range));
        assert_eq!(store.get::<TimeRange>("other").expect("absent is fine"), None);
        store.insert("TIME_RANGE", "bad", entry(json!(42)));
        assert!(matches!(store.get::<TimeRange>("bad"), Err(ContextError::Shape { .. })));
    }

    #[test]
    fn summaries_follow_truncation_rules() {
        let long = "x".repeat(250);
        let summary = summarize(&json!({"text": long, "list": (0..20).collect::<Vec<_>>(), "deep": {"a": {"b": {"c": [1, 2]}}}}));
        assert_eq!(summary["text"], json!(format!("{}... (truncated from 250 chars)", "x".repeat(100))));
        assert_eq!(summary["list"], json!([0, 1, 2, "...(truncated, 20 items in total)"]));
        assert_eq!(summary["deep"]["a"]["b"], json!("{1 keys}"));
        let wide: serde_json::Map<String, Value> = (0..12).map(|i| (format!("k{i:02}"), json!(i))).collect();
        let summary = summarize(&Value::Object(wide));
        assert_eq!(summary.as_object().map(serde_json::Map::len), Some(4));
    }

    #[test]
    fn summaries_of_a_step_cover_only_its_inputs() {
        let mut store = ContextStore::default();
        store.insert("A", "a", entry(json!(1)));
        store.insert("B", "b", entry(json!(2)));
        assert_eq!(store.summaries(Some(&step_with(&[("B", "b")]))), vec![(InputRef::new("B", "b"), json!(2))]);
        assert!(store.summaries(Some(&step_with(&[]))).is_empty());
        assert_eq!(store.summaries(None).len(), 2);
    }
}
