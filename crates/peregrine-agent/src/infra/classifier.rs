//! The classifier (reference §2.3): decides which capabilities the task needs. Always-active
//! capabilities (respond, clarify) are in without asking; `/caps:off` activates everything; the
//! rest are decided by the LLM — upstream's one `CapabilityMatch` yes/no call per capability
//! (bounded concurrency) or one batched `CapabilitySelection` call — and then every selected
//! capability's required context is made available by adding its providers, transitively.

mod prompts;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use peregrine_core::concurrency::run_bounded;
use peregrine_core::events::{EventKind, Phase};
use peregrine_core::{
    AgentEvent, AgentState, AgentStateUpdate, CapabilityError, CapabilityOutcome, ContextStore, ErrorClassification, ErrorSeverity,
    RetryPolicy, Slot,
};
use peregrine_graph::NodeContext;
use peregrine_llm::{CallOptions, FaultClass, LlmError, ResponseSchema, roles, schema_for};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use self::prompts::{Candidate, ClassifierPrompts, DefaultClassifierPrompts, MatchRequest, SelectionRequest, user_request};
use crate::catalog::Catalog;
use crate::nodes::{InfrastructureNode, NodeEvents};
use crate::router::CLASSIFIER;
use crate::services::Services;
use crate::settings::ClassifierMode;

/// The per-capability answer: whether the request needs the capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CapabilityMatch {
    /// True if the user's request needs the capability.
    pub is_match: bool,
}

/// The batched answer: which capabilities the request needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CapabilitySelection {
    /// One or two sentences on what the request needs (first, so the model reasons before it
    /// decides).
    pub reasoning: String,
    /// The names of the needed capabilities; possibly empty.
    pub selected: Vec<String>,
}

/// The longest `reasoning` the batched selection schema allows.
pub const MAX_REASONING_CHARS: usize = 400;

/// The `CapabilitySelection` schema with `selected` narrowed to the candidates' names, so a
/// provider with native structured output cannot name anything else (the answer is still
/// checked, since not every provider enforces schemas).
pub fn selection_schema<'a>(candidates: impl IntoIterator<Item = &'a str>) -> ResponseSchema {
    let mut schema = schema_for::<CapabilitySelection>();
    let names: Vec<serde_json::Value> = candidates.into_iter().map(serde_json::Value::from).collect();
    let count = names.len();
    let items = serde_json::json!({ "type": "string", "enum": names });
    if let Some(selected) = schema.schema.pointer_mut("/properties/selected").and_then(serde_json::Value::as_object_mut) {
        selected.insert("items".into(), items);
        selected.insert("uniqueItems".into(), serde_json::Value::Bool(true));
        // Bounds keep a grammar-constrained local model from running away (repeating names,
        // endless reasoning) until it hits the token cap.
        selected.insert("maxItems".into(), serde_json::Value::from(count));
    }
    if let Some(reasoning) = schema.schema.pointer_mut("/properties/reasoning").and_then(serde_json::Value::as_object_mut) {
        reasoning.insert("maxLength".into(), serde_json::Value::from(MAX_REASONING_CHARS));
    }
    schema
}

/// The classifier node.
pub struct Classifier {
    services: Services,
    catalog: Arc<Catalog>,
    prompts: Arc<dyn ClassifierPrompts>,
}

impl Classifier {
    /// A classifier over the registered capabilities, with the default prompts.
    pub fn new(services: Services, catalog: Arc<Catalog>) -> Self {
        Self { services, catalog, prompts: Arc::new(DefaultClassifierPrompts) }
    }

    /// Replaces the prompt builder.
    pub fn with_prompts(mut self, prompts: Arc<dyn ClassifierPrompts>) -> Self {
        self.prompts = prompts;
        self
    }

    /// The capabilities the LLM decides on: not always active, with a classifier guide (one
    /// without a guide is never selected), in catalog order.
    fn candidates(&self) -> Vec<Candidate<'_>> {
        self.catalog
            .specs()
            .iter()
            .filter(|spec| !spec.always_active)
            .filter_map(|spec| spec.classifier_guide.as_ref().map(|guide| Candidate { spec, guide }))
            .collect()
    }

    /// The selected capability names (unordered; the caller puts them in catalog order).
    async fn select(&self, state: &AgentState, ctx: &NodeContext<AgentState>) -> Result<HashSet<String>, CapabilityError> {
        let mut selected: HashSet<String> =
            self.catalog.specs().iter().filter(|spec| spec.always_active).map(|spec| spec.name.clone()).collect();
        let candidates = self.candidates();
        if candidates.is_empty() {
            return Ok(selected);
        }
        let task = state.task.current_task.as_deref().map(str::trim).filter(|task| !task.is_empty()).ok_or_else(|| {
            let message = "the classifier ran without a task; task extraction must run first";
            CapabilityError::new(message).classified(ErrorClassification::critical(message))
        })?;
        let previous_failure = previous_failure(state);
        let sink = NodeEvents(ctx);
        let options = CallOptions { events: Some(&sink), component: Some(CLASSIFIER) };
        let chosen = match self.services.settings.classifier_mode {
            ClassifierMode::PerCapability => self.select_per_capability(task, &candidates, previous_failure.as_deref(), options).await?,
            ClassifierMode::Batched => self.select_batched(task, &candidates, previous_failure.as_deref(), options).await?,
        };
        selected.extend(chosen);
        Ok(selected)
    }

    /// Upstream's algorithm: one `CapabilityMatch` call per candidate, at most
    /// `max_concurrent_classifications` in flight. A failed call counts as "not selected";
    /// when every call failed the node fails instead of silently selecting nothing.
    async fn select_per_capability(
        &self,
        task: &str,
        candidates: &[Candidate<'_>],
        previous_failure: Option<&str>,
        options: CallOptions<'_>,
    ) -> Result<Vec<String>, CapabilityError> {
        let limit = self.services.settings.limits.max_concurrent_classifications;
        // Indices rather than candidates as items: a closure taking a borrowed `Candidate` would
        // have to be general over its lifetime, which the `Send` check of this future cannot prove.
        let answers = run_bounded(0..candidates.len(), limit, |index| {
            let candidate = candidates[index];
            async move {
                let messages = self.prompts.build_match(&MatchRequest { task, candidate, previous_failure });
                let answer = self.services.llm.structured::<CapabilityMatch>(roles::CLASSIFIER, messages, options).await;
                (candidate.spec.name.as_str(), answer)
            }
        })
        .await;
        let mut chosen = Vec::new();
        let mut failures = Vec::new();
        for (name, answer) in answers {
            match answer {
                Ok(CapabilityMatch { is_match: true }) => chosen.push(name.to_owned()),
                Ok(CapabilityMatch { is_match: false }) => {}
                Err(error) => {
                    tracing::warn!(capability = name, %error, "classification failed; the capability is not selected");
                    failures.push(error);
                }
            }
        }
        if failures.len() == candidates.len() {
            // A configuration fault (CRITICAL) wins over transient ones: retrying cannot fix it.
            let worst = failures.iter().position(|error| error.class() == FaultClass::Critical).unwrap_or(0);
            let error = failures.swap_remove(worst);
            return Err(llm_failure(error, "every capability classification failed"));
        }
        Ok(chosen)
    }

    /// One `CapabilitySelection` call deciding every candidate; names that are not candidates
    /// are ignored (the answer is untrusted).
    async fn select_batched(
        &self,
        task: &str,
        candidates: &[Candidate<'_>],
        previous_failure: Option<&str>,
        options: CallOptions<'_>,
    ) -> Result<Vec<String>, CapabilityError> {
        let messages = self.prompts.build_selection(&SelectionRequest { task, candidates, previous_failure });
        let schema = selection_schema(candidates.iter().map(|candidate| candidate.spec.name.as_str()));
        let answer: CapabilitySelection = self
            .services
            .llm
            .structured_with_schema(roles::CLASSIFIER, messages, schema, options)
            .await
            .map_err(|error| llm_failure(error, "capability selection failed"))?;
        let mut chosen = Vec::new();
        for name in answer.selected {
            let name = name.trim();
            if candidates.iter().any(|candidate| candidate.spec.name == name) {
                chosen.push(name.to_owned());
            } else if !self.catalog.get(name).is_some_and(|spec| spec.always_active) {
                tracing::warn!(capability = name, "the classifier named a capability that is not a candidate; ignored");
            }
        }
        tracing::debug!(reasoning = %answer.reasoning, "capability selection");
        Ok(chosen)
    }
}

/// `Capability X requested reclassification: <message>` when the pending error asks for a
/// re-classification (reference §2.3).
fn previous_failure(state: &AgentState) -> Option<String> {
    let info = state.control.error_info.as_ref().filter(|_| state.control.has_error)?;
    if info.classification.severity != ErrorSeverity::Reclassification {
        return None;
    }
    let message = info.classification.user_message.as_deref().unwrap_or(&info.original_error);
    Some(format!("Capability {} requested reclassification: {message}", info.node))
}

/// Adds, until nothing changes, a provider for every context type a selected capability
/// requires that is neither stored yet nor provided by a selected capability. When several
/// capabilities provide the type, all of them are added (the orchestrator picks one).
pub fn expand_dependencies(catalog: &Catalog, context: &ContextStore, selected: &mut HashSet<String>) {
    loop {
        let mut added = Vec::new();
        for spec in catalog.specs().iter().filter(|spec| selected.contains(&spec.name)) {
            for requirement in &spec.requires {
                let context_type = requirement.context_type.as_str();
                if context.has_type(context_type) {
                    continue;
                }
                let providers: Vec<&str> = catalog.providers_of(context_type).map(|provider| provider.name.as_str()).collect();
                if providers.iter().any(|provider| selected.contains(*provider)) {
                    continue;
                }
                added.extend(providers.into_iter().map(str::to_owned));
            }
        }
        let before = selected.len();
        for name in added {
            if !selected.contains(&name) {
                tracing::debug!(capability = %name, "added as the provider of a required context");
                selected.insert(name);
            }
        }
        if selected.len() == before {
            return;
        }
    }
}

/// An LLM failure with its classification attached (RETRIABLE transient faults and invalid
/// output, CRITICAL configuration and authentication problems).
fn llm_failure(error: LlmError, what: &str) -> CapabilityError {
    let mut classification = error.classification();
    let detail = classification.user_message.take().unwrap_or_default();
    classification.user_message = Some(format!("{what}: {detail}"));
    CapabilityError::new(format!("{what}: {error}")).classified(classification)
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl InfrastructureNode for Classifier {
    fn name(&self) -> &str {
        CLASSIFIER
    }

    fn description(&self) -> &str {
        "capability classification"
    }

    fn classify_error(&self, error: &CapabilityError) -> ErrorClassification {
        if let Some(classification) = error.classification() {
            return classification.clone();
        }
        match error.downcast_ref::<LlmError>() {
            Some(llm) => llm.classification(),
            None => ErrorClassification::critical(format!("Capability classification failed: {}", error.message())),
        }
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::classifier()
    }

    async fn execute(&self, state: &AgentState, ctx: &NodeContext<AgentState>) -> Result<CapabilityOutcome, CapabilityError> {
        let started = Instant::now();
        ctx.emit(AgentEvent::new(
            CLASSIFIER,
            EventKind::PhaseStart { phase: Phase::Classification, description: "Selecting the capabilities the task needs".into() },
        ));
        let result = if state.agent_control.capability_selection_bypass_enabled {
            Ok(self.catalog.names().map(str::to_owned).collect())
        } else {
            self.select(state, ctx).await.map(|mut selected| {
                expand_dependencies(&self.catalog, &state.capability_context_data, &mut selected);
                selected
            })
        };
        ctx.emit(AgentEvent::new(
            CLASSIFIER,
            EventKind::PhaseComplete { phase: Phase::Classification, duration_ms: elapsed_ms(started), success: result.is_ok() },
        ));
        let selected = result?;
        let active: Vec<String> = self.catalog.names().filter(|name| selected.contains(*name)).map(str::to_owned).collect();
        ctx.emit(AgentEvent::new(
            CLASSIFIER,
            EventKind::CapabilitiesSelected {
                capability_names: active.clone(),
                all_capability_names: self.catalog.names().map(str::to_owned).collect(),
            },
        ));
        Ok(CapabilityOutcome::Done(AgentStateUpdate {
            active_capabilities: Some(active),
            execution_plan: Slot::Set(None),
            current_step_index: Some(0),
            ..AgentStateUpdate::default()
        }))
    }
}

#[cfg(test)]
mod tests;
