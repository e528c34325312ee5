//! The `Capability` trait applications implement, with the spec the registry, classifier and
//! orchestrator read (name, provides/requires, guides and examples) and the error type
//! capabilities fail with.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::context::{ConstraintMode, ContextError, ContextStore, ContextType, ExtractedContexts, Requirement};
use crate::error::{ErrorClassification, RetryPolicy};
use crate::events::AgentEvent;
use crate::plan::PlannedStep;
use crate::state::{AgentState, AgentStateUpdate};

/// A few-shot example for the classifier's yes/no question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifierExample {
    /// The user request.
    pub query: String,
    /// Whether the capability is needed.
    pub result: bool,
    /// Why.
    pub reason: String,
}

impl ClassifierExample {
    /// `User Query: "<q>" -> Expected Output: <bool> -> Reason: <r>`.
    pub fn format_for_prompt(&self) -> String {
        format!("User Query: \"{}\" -> Expected Output: {} -> Reason: {}", self.query, self.result, self.reason)
    }
}

/// What the classifier is told about a capability. Without one, a capability is never selected
/// unless it is always active.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassifierGuide {
    /// When the capability is needed.
    pub instructions: String,
    /// Few-shot examples.
    pub examples: Vec<ClassifierExample>,
    /// Extra guidance when it is selected.
    #[serde(default)]
    pub actions_if_true: Option<String>,
}

/// A plan-step example for the orchestrator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrchestratorExample {
    /// The example step.
    pub step: PlannedStep,
    /// When it applies.
    pub scenario_description: String,
    /// Context it needs.
    #[serde(default)]
    pub context_requirements: Option<String>,
    /// Notes.
    #[serde(default)]
    pub notes: Option<String>,
}

/// What the orchestrator is told about a capability.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OrchestratorGuide {
    /// How to plan with it.
    pub instructions: String,
    /// Example steps.
    pub examples: Vec<OrchestratorExample>,
    /// Lower prints earlier in the planning prompt.
    pub priority: i32,
}

/// Static description of a capability.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CapabilitySpec {
    /// Unique name; plan steps refer to it.
    pub name: String,
    /// One line for overviews.
    pub description: String,
    /// Context types it stores.
    pub provides: Vec<String>,
    /// Context types it reads.
    pub requires: Vec<Requirement>,
    /// Selected every turn without classification (respond, clarify).
    pub always_active: bool,
    /// Can be talked to directly with `/chat:<name>`.
    pub direct_chat_enabled: bool,
    /// Classifier guide.
    pub classifier_guide: Option<ClassifierGuide>,
    /// Orchestrator guide.
    pub orchestrator_guide: Option<OrchestratorGuide>,
}

impl CapabilitySpec {
    /// A spec with a name and description and nothing else.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self { name: name.into(), description: description.into(), ..Self::default() }
    }
}

/// Where capabilities send events.
pub trait EventSink: Send + Sync {
    /// Emits one event.
    fn emit(&self, event: AgentEvent);
}

/// An event sink that drops everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl EventSink for NoEvents {
    fn emit(&self, _event: AgentEvent) {}
}

/// An approval a capability asks for before an action with side effects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// `{capability}_{operation}`, e.g. `python_executor`, `memory_save`, `channel_write`.
    pub approval_type: String,
    /// Markdown prompt for the person.
    pub user_message: String,
    /// What is being approved; the approval is bound to its digest.
    pub payload: Value,
}

/// A person's answer to an approval request, as verified by the engine: it is bound to the
/// digest of the payload that was shown, and reaches only the node that asked, once per
/// delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalAnswer {
    /// The approval type that was asked for.
    pub approval_type: String,
    /// Whether the person approved. Anything but an explicit approval counts as a rejection.
    pub approved: bool,
    /// Exactly what was approved (the request's payload).
    pub payload: Value,
    /// How many times this answer has been delivered; above 1 the approved action may already
    /// have run before a crash or cancellation, so check before repeating a side effect.
    pub delivery: u32,
    /// A replacement the person approved instead of the payload as shown (an edited plan);
    /// the node validates it like any other untrusted input before using it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit: Option<Value>,
    /// What the person said with the answer, when it was more than a yes or no ("no, use
    /// Oslo"): a node that asks again (a re-plan) takes it into account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
}

impl ApprovalAnswer {
    /// Whether this answer approves `request_type` (and is not a rejection).
    pub fn approves(&self, request_type: &str) -> bool {
        self.approved && self.approval_type == request_type
    }

    /// Whether the approved action may already have run (a redelivery after a crash or cancel).
    pub fn is_redelivery(&self) -> bool {
        self.delivery > 1
    }
}

/// What a capability sees when it runs.
pub struct CapabilityInput<'a> {
    /// The whole state.
    pub state: &'a AgentState,
    /// The plan step being run.
    pub step: &'a PlannedStep,
    /// The capability's own spec.
    pub spec: &'a CapabilitySpec,
    /// Event sink.
    pub events: &'a dyn EventSink,
    /// The answer to this capability's approval request, when it runs again after one.
    pub approval: Option<&'a ApprovalAnswer>,
}

impl CapabilityInput<'_> {
    /// The step's inputs, checked against the spec's `requires`.
    pub fn required_contexts(&self, mode: ConstraintMode) -> Result<ExtractedContexts, ContextError> {
        self.state.capability_context_data.extract_from_step(self.step, &self.spec.requires, mode)
    }

    /// The step objective, or the current task when the step has none.
    pub fn task_objective(&self) -> &str {
        if self.step.task_objective.is_empty() {
            self.state.task.current_task.as_deref().unwrap_or_default()
        } else {
            &self.step.task_objective
        }
    }

    /// An update storing `value` under the step's context key; refuses types the capability
    /// does not declare in `provides`.
    pub fn store_output<T: ContextType>(&self, value: &T) -> Result<AgentStateUpdate, CapabilityError> {
        if !self.spec.provides.iter().any(|provided| provided == T::CONTEXT_TYPE) {
            return Err(CapabilityError::new(format!(
                "capability '{}' stored {} but declares provides = [{}]; add it to provides",
                self.spec.name,
                T::CONTEXT_TYPE,
                self.spec.provides.join(", ")
            )));
        }
        let mut store = ContextStore::default();
        store.set(self.step.context_key.clone(), value, Some(self.step.task_objective.clone())).map_err(CapabilityError::from_error)?;
        Ok(AgentStateUpdate { context: Some(store), ..AgentStateUpdate::default() })
    }
}

/// What a capability returns on success.
#[allow(clippy::large_enum_variant, reason = "returned once per step and moved straight into the engine")]
#[derive(Debug, Clone, PartialEq)]
pub enum CapabilityOutcome {
    /// Done: apply this update and go on.
    Done(AgentStateUpdate),
    /// Pause the run until a person answers.
    NeedsApproval(ApprovalRequest),
}

/// A capability failure, classified by the capability's `classify_error`.
#[derive(Clone)]
pub struct CapabilityError {
    message: String,
    classification: Option<ErrorClassification>,
    source: Option<Arc<dyn StdError + Send + Sync>>,
}

impl CapabilityError {
    /// A failure described by `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), classification: None, source: None }
    }

    /// A failure caused by `error`.
    pub fn from_error(error: impl StdError + Send + Sync + 'static) -> Self {
        Self { message: error.to_string(), classification: None, source: Some(Arc::new(error)) }
    }

    /// Attaches the classification the capability already knows.
    pub fn classified(mut self, classification: ErrorClassification) -> Self {
        self.classification = Some(classification);
        self
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The attached classification, if any.
    pub fn classification(&self) -> Option<&ErrorClassification> {
        self.classification.as_ref()
    }

    /// The underlying error of type `E`, for `classify_error` implementations.
    pub fn downcast_ref<E: StdError + 'static>(&self) -> Option<&E> {
        self.source.as_deref().and_then(|source| (source as &(dyn StdError + 'static)).downcast_ref::<E>())
    }

    /// The attached classification, or CRITICAL with the message.
    pub fn default_classification(&self) -> ErrorClassification {
        self.classification.clone().unwrap_or_else(|| ErrorClassification::critical(self.message.clone()))
    }
}

impl fmt::Debug for CapabilityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CapabilityError")
            .field("message", &self.message)
            .field("classification", &self.classification)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for CapabilityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for CapabilityError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_deref().map(|source| source as &(dyn StdError + 'static))
    }
}

/// A unit of domain work run as a plan step.
pub trait Capability: Send + Sync + 'static {
    /// Its static description.
    fn spec(&self) -> &CapabilitySpec;

    /// Classifies a failure; defaults to the error's attached classification or CRITICAL.
    fn classify_error(&self, error: &CapabilityError) -> ErrorClassification {
        error.default_classification()
    }

    /// How failures are retried; 3 attempts, 0.5 s, ×1.5 by default.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::capability_default()
    }

    /// Runs the step.
    fn execute(&self, input: CapabilityInput<'_>) -> impl Future<Output = Result<CapabilityOutcome, CapabilityError>> + Send;
}

/// A boxed future, for type-erased capabilities.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe form of [`Capability`] the registry stores; implemented for every capability.
pub trait DynCapability: Send + Sync + 'static {
    /// See [`Capability::spec`].
    fn spec(&self) -> &CapabilitySpec;
    /// See [`Capability::classify_error`].
    fn classify_error(&self, error: &CapabilityError) -> ErrorClassification;
    /// See [`Capability::retry_policy`].
    fn retry_policy(&self) -> RetryPolicy;
    /// See [`Capability::execute`].
    fn execute_boxed<'a>(&'a self, input: CapabilityInput<'a>) -> BoxFuture<'a, Result<CapabilityOutcome, CapabilityError>>;
}

impl<C: Capability> DynCapability for C {
    fn spec(&self) -> &CapabilitySpec {
        Capability::spec(self)
    }
    fn classify_error(&self, error: &CapabilityError) -> ErrorClassification {
        Capability::classify_error(self, error)
    }
    fn retry_policy(&self) -> RetryPolicy {
        Capability::retry_policy(self)
    }
    fn execute_boxed<'a>(&'a self, input: CapabilityInput<'a>) -> BoxFuture<'a, Result<CapabilityOutcome, CapabilityError>> {
        Box::pin(self.execute(input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorSeverity;

    #[derive(Debug, thiserror::Error)]
    #[error("channel {0} not found")]
    struct ChannelNotFound(String);

    #[test]
    fn errors_keep_their_cause_for_classification() {
        let error = CapabilityError::from_error(ChannelNotFound("SR:X".into()));
        assert_eq!(error.downcast_ref::<ChannelNotFound>().map(|e| e.0.as_str()), Some("SR:X"));
        assert_eq!(error.default_classification().severity, ErrorSeverity::Critical);
        let retriable = CapabilityError::new("timeout").classified(ErrorClassification::retriable("timed out"));
        assert_eq!(retriable.default_classification().severity, ErrorSeverity::Retriable);
    }

    #[test]
    fn classifier_examples_format_like_upstream() {
        let example = ClassifierExample { query: "read the current".into(), result: true, reason: "reads a PV".into() };
        assert_eq!(example.format_for_prompt(), "User Query: \"read the current\" -> Expected Output: true -> Reason: reads a PV");
    }
}
