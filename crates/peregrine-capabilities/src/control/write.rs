//! `channel_write`: the `channel_write` model turns the task into typed write operations, and
//! each passes the gates in order — the master switch (before any model call), the limits that
//! need no reading, the channel's type, the step from its current value — then the person
//! approves exactly the operations shown (channel, current value, new value, limits), then the
//! whole operation is checked again under the channels' locks and written, each write verified.

use std::sync::Arc;

use peregrine_agent::Services;
use peregrine_control::{
    ChannelLocks, ChannelValue, ControlError, PartialWrite, PlannedWrite, SharedControlSystem, WriteGate, WriteJournal, WriteOutcome,
    WriteSettings,
};
use peregrine_core::events::StatusLevel;
use peregrine_core::{
    AgentEvent, ApprovalAnswer, ApprovalDecision, ApprovalRequest, Capability, CapabilityError, CapabilityInput, CapabilityOutcome,
    CapabilitySpec, ChannelWriteStage, ErrorClassification, approval_message,
};
use peregrine_llm::{CallOptions, roles};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{
    CHANNEL_ADDRESSES, CHANNEL_WRITE_APPROVAL, CHANNEL_WRITE_CAPABILITY, CHANNEL_WRITE_RESULTS, ChannelPrompts, ChannelWriteResult,
    ChannelWriteResults, DefaultChannelPrompts, MAX_CHANNELS_PER_STEP, WriteParsingRequest, addresses_from_inputs, approval_cell,
    control_error, write_event,
};

/// The directory, in the agent data directory, of the approved operations' write journals.
pub const JOURNAL_DIR: &str = "control_writes";

/// `operation_result` of an operation the person rejected.
pub const CANCELLED_BY_USER: &str = "cancelled by the user";

/// A value to write: a number, or text (an enum state's label, a string channel's text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum WriteValue {
    /// A number.
    Number(f64),
    /// Text.
    Text(String),
}

impl WriteValue {
    fn text(&self) -> String {
        match self {
            Self::Number(number) => number.to_string(),
            Self::Text(text) => text.clone(),
        }
    }
}

/// One write the task asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WriteOperation {
    /// The channel address (EPICS process variable name), exactly as given.
    pub channel_address: String,
    /// The value to write.
    pub value: WriteValue,
    /// The units the task states, if any.
    #[serde(default)]
    pub units: Option<String>,
    /// Why, in a few words.
    #[serde(default)]
    pub notes: Option<String>,
}

/// The `channel_write` model's answer: the writes the task asks for (Osprey's
/// `WriteOperationsOutput`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WriteOperationsOutput {
    /// The writes, in order; empty when the task names no clear write.
    pub write_operations: Vec<WriteOperation>,
}

/// The `channel_write` capability.
pub struct ChannelWriteCapability {
    services: Services,
    connector: SharedControlSystem,
    settings: WriteSettings,
    locks: ChannelLocks,
    prompts: Arc<dyn ChannelPrompts>,
    spec: CapabilitySpec,
}

impl std::fmt::Debug for ChannelWriteCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelWriteCapability")
            .field("connector", &self.connector.name())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn write_spec(prompts: &dyn ChannelPrompts) -> CapabilitySpec {
    CapabilitySpec {
        provides: vec![CHANNEL_WRITE_RESULTS.into()],
        classifier_guide: Some(prompts.write_classifier_guide()),
        orchestrator_guide: Some(prompts.write_orchestrator_guide()),
        ..CapabilitySpec::new(
            CHANNEL_WRITE_CAPABILITY,
            "Write values to control-system channels (process variables), within the channel limits and after approval",
        )
    }
}

fn critical(message: impl Into<String>) -> CapabilityError {
    let message = message.into();
    CapabilityError::new(message.clone()).classified(ErrorClassification::critical(message))
}

fn replanning(message: impl Into<String>) -> CapabilityError {
    let message = message.into();
    CapabilityError::new(message.clone()).classified(ErrorClassification::replanning(message))
}

impl ChannelWriteCapability {
    /// The capability over `connector` with the write gates of `settings` and the default
    /// prompts. Every capability writing through one connector in a process should share
    /// `locks` ([`Self::with_locks`]); a new one has its own.
    pub fn new(services: Services, connector: SharedControlSystem, settings: WriteSettings) -> Self {
        let prompts: Arc<dyn ChannelPrompts> = Arc::new(DefaultChannelPrompts);
        Self { services, connector, settings, locks: ChannelLocks::default(), spec: write_spec(prompts.as_ref()), prompts }
    }

    /// Replaces the prompts (and the guides in the spec).
    pub fn with_prompts(mut self, prompts: Arc<dyn ChannelPrompts>) -> Self {
        self.spec = write_spec(prompts.as_ref());
        self.prompts = prompts;
        self
    }

    /// Shares the per-channel locks with other writers in this process.
    pub fn with_locks(mut self, locks: ChannelLocks) -> Self {
        self.locks = locks;
        self
    }

    /// The gates for this turn: the configured ones, with the master switch on only when the
    /// turn's own switch (`agent_control.control_system_writes_enabled`) is on too.
    fn gates_for(&self, input: &CapabilityInput<'_>) -> WriteSettings {
        let mut settings = self.settings.clone();
        settings.writes_enabled = settings.writes_enabled && input.state.agent_control.control_system_writes_enabled;
        settings
    }

    fn status(input: &CapabilityInput<'_>, level: StatusLevel, message: impl Into<String>) {
        input.events.emit(AgentEvent::status(CHANNEL_WRITE_CAPABILITY, level, message));
    }

    /// The operations the task asks for, by the `channel_write` model, checked for shape.
    async fn operations(&self, input: &CapabilityInput<'_>) -> Result<Vec<WriteOperation>, CapabilityError> {
        let given = addresses_from_inputs(input)?;
        let step_inputs = input.state.capability_context_data.summary_lines(input.step);
        let request = WriteParsingRequest { task_objective: input.task_objective(), channels: &given, step_inputs: &step_inputs };
        let options = CallOptions { events: Some(input.events), component: Some(CHANNEL_WRITE_CAPABILITY) };
        let output: WriteOperationsOutput = self
            .services
            .llm
            .structured(roles::CHANNEL_WRITE, self.prompts.write_messages(&request), options)
            .await
            .map_err(CapabilityError::from)?;
        let operations: Vec<WriteOperation> = output
            .write_operations
            .into_iter()
            .map(|operation| WriteOperation { channel_address: operation.channel_address.trim().to_owned(), ..operation })
            .collect();
        if operations.is_empty() {
            return Err(replanning("No write operation could be read from the task; name the channel and the value to write"));
        }
        if operations.len() > MAX_CHANNELS_PER_STEP {
            return Err(replanning(format!("The task asks for {} writes in one step; at most {MAX_CHANNELS_PER_STEP}", operations.len())));
        }
        if let Some(operation) = operations.iter().find(|operation| operation.channel_address.is_empty()) {
            return Err(replanning(format!("A write operation names no channel (value {})", operation.value.text())));
        }
        if !given.is_empty()
            && let Some(stray) = operations.iter().find(|operation| !given.contains(&operation.channel_address))
        {
            return Err(replanning(format!(
                "The write names channel '{}', which is not among the step's {CHANNEL_ADDRESSES} ({})",
                stray.channel_address,
                given.join(", ")
            )));
        }
        Ok(operations)
    }

    /// The typed value of each operation in its channel's type; the gates that need no reading
    /// run first, so a stopped write's channel is never even read.
    async fn typed(
        &self,
        input: &CapabilityInput<'_>,
        gate: &WriteGate<'_>,
        operations: &[WriteOperation],
    ) -> Result<Vec<(String, ChannelValue)>, CapabilityError> {
        for operation in operations {
            let numeric = match operation.value {
                WriteValue::Number(number) => Some(ChannelValue::Double(number)),
                WriteValue::Text(_) => None,
            };
            gate.precheck(&operation.channel_address, numeric.as_ref())
                .map_err(|error| self.stopped(input, &operation.channel_address, &operation.value.text(), error))?;
        }
        let mut typed = Vec::with_capacity(operations.len());
        for operation in operations {
            let address = &operation.channel_address;
            let current = self.connector.read_boxed(address).await.map_err(control_error)?;
            let enum_strings = match current.value {
                ChannelValue::Enum { .. } => self.connector.metadata_boxed(address).await.map_err(control_error)?.enum_strings,
                _ => Vec::new(),
            };
            let stated = operation.units.as_deref().map(str::trim).filter(|units| !units.is_empty());
            let channel_units = current.units.as_deref().map(str::trim).filter(|units| !units.is_empty());
            if let (Some(stated), Some(channel_units)) = (stated, channel_units)
                && stated != channel_units
            {
                return Err(critical(format!(
                    "the task gives the value for '{address}' in {stated}, but the channel is in {channel_units}; nothing was written — \
                     give the value in {channel_units}"
                )));
            }
            let value = ChannelValue::parse_as(&operation.value.text(), &current.value, &enum_strings, address).map_err(control_error)?;
            typed.push((address.clone(), value));
        }
        Ok(typed)
    }

    /// A gate's stop: the event, and the error that ends the turn with a report.
    fn stopped(&self, input: &CapabilityInput<'_>, address: &str, value: &str, error: ControlError) -> CapabilityError {
        if error.is_block() {
            write_event(input, ChannelWriteStage::Blocked, address, value.to_owned(), None, error.to_string());
            Self::status(input, StatusLevel::Error, format!("Write stopped: {error}"));
        }
        control_error(error)
    }

    /// Writes the operation (approved, or needing no approval): every write checked again under
    /// the channels' locks, then written and verified in order.
    async fn commit(
        &self,
        input: &CapabilityInput<'_>,
        settings: &WriteSettings,
        writes: &[(String, ChannelValue)],
        operation_id: Option<(&str, bool)>,
        shown: &[Option<ChannelValue>],
    ) -> Result<CapabilityOutcome, CapabilityError> {
        let gate = WriteGate::new(settings, self.connector.as_ref());
        let mut journal = match operation_id {
            Some((id, redelivered)) => {
                let dir = self.services.settings.agent_data_dir.join(JOURNAL_DIR);
                Some(WriteJournal::open(&dir, id, shown.to_vec(), !redelivered).await.map_err(control_error)?)
            }
            None => None,
        };
        match gate.execute_all(writes, &self.locks, journal.as_mut()).await {
            Ok(outcomes) => {
                let results: Vec<ChannelWriteResult> = outcomes.iter().map(|outcome| self.written(input, outcome)).collect();
                let verified = results.iter().filter(|result| result.success).count();
                let summary = format!("Wrote {} channel{} ({verified} verified)", results.len(), if results.len() == 1 { "" } else { "s" });
                Self::status(input, StatusLevel::Success, summary);
                let output = ChannelWriteResults {
                    total_writes: results.len(),
                    successful_count: verified,
                    failed_count: results.len() - verified,
                    results,
                    operation_result: "written".into(),
                };
                Ok(CapabilityOutcome::Done(input.store_output(&output)?))
            }
            Err(PartialWrite { done, error }) => {
                for outcome in &done {
                    self.written(input, outcome);
                }
                let (address, value) = failed_write(writes, done.len());
                if done.is_empty() {
                    if error.is_block() {
                        return Err(self.stopped(input, &address, &value, error));
                    }
                    write_event(input, ChannelWriteStage::Failed, &address, value, None, error.to_string());
                    return Err(control_error(error));
                }
                write_event(input, ChannelWriteStage::Failed, &address, value, None, error.to_string());
                let written: Vec<String> = done
                    .iter()
                    .map(|outcome| format!("{} = {} ({})", outcome.address, outcome.value.display(), outcome.verification.notes))
                    .collect();
                let message = format!(
                    "The write operation stopped part-way: {error}. Already written: {}. The writes after it were not sent, and \
                     nothing is retried; check the channels before writing again",
                    written.join("; ")
                );
                Err(CapabilityError::from_error(error).classified(ErrorClassification::critical(message)))
            }
        }
    }

    /// The event and result of one write that happened.
    fn written(&self, input: &CapabilityInput<'_>, outcome: &WriteOutcome) -> ChannelWriteResult {
        let verification = &outcome.verification;
        let checked = verification.verified || verification.level == peregrine_control::VerificationLevel::None;
        let stage = if outcome.already_written { ChannelWriteStage::AlreadyWritten } else { ChannelWriteStage::Written };
        write_event(input, stage, &outcome.address, outcome.value.display(), Some(outcome.previous.display()), verification.notes.clone());
        ChannelWriteResult {
            channel_address: outcome.address.clone(),
            value_written: outcome.value.display(),
            previous_value: Some(outcome.previous.display()),
            success: checked,
            already_written: outcome.already_written,
            verification_level: verification.level,
            verified: verification.verified,
            readback_value: verification.readback.as_ref().map(ChannelValue::display),
            tolerance_used: verification.tolerance,
            verification_notes: verification.notes.clone(),
        }
    }

    /// The run after a person answered this step's approval: no model call, exactly the
    /// approved operations (or nothing, on a rejection).
    async fn resume(&self, input: &CapabilityInput<'_>, answer: &ApprovalAnswer) -> Result<CapabilityOutcome, CapabilityError> {
        if answer.approval_type != CHANNEL_WRITE_APPROVAL {
            return Err(critical(format!(
                "channel_write received an answer to a '{}' approval but only asks for '{CHANNEL_WRITE_APPROVAL}'; nothing was written",
                answer.approval_type
            )));
        }
        let writes = approved_writes(&answer.payload)?;
        if !answer.approves(CHANNEL_WRITE_APPROVAL) {
            for (address, value) in &writes {
                write_event(input, ChannelWriteStage::Blocked, address, value.display(), None, "the approval was rejected");
            }
            Self::status(input, StatusLevel::Warning, "Channel write cancelled by the user; nothing was written");
            let output = ChannelWriteResults {
                results: Vec::new(),
                total_writes: 0,
                successful_count: 0,
                failed_count: 0,
                operation_result: CANCELLED_BY_USER.into(),
            };
            return Ok(CapabilityOutcome::Done(input.store_output(&output)?));
        }
        if answer.edit.is_some() {
            return Err(critical(
                "an approved channel write cannot be edited in the approval; nothing was written — ask again with the values you want",
            ));
        }
        let Some(operation_id) = answer.payload.get("operation_id").and_then(Value::as_str) else {
            return Err(critical("the approved channel write carries no operation id; nothing was written"));
        };
        let settings = self.gates_for(input);
        let shown = shown_values(&answer.payload);
        self.commit(input, &settings, &writes, Some((operation_id, answer.is_redelivery())), &shown).await
    }
}

/// The write an operation stopped at (the one after the `done` writes).
fn failed_write(writes: &[(String, ChannelValue)], done: usize) -> (String, String) {
    writes.get(done).map_or_else(|| (String::new(), String::new()), |(address, value)| (address.clone(), value.display()))
}

/// The approved operations from the approval payload (bound to what was shown by its digest).
fn approved_writes(payload: &Value) -> Result<Vec<(String, ChannelValue)>, CapabilityError> {
    let operations = payload.get("operations").and_then(Value::as_array).filter(|operations| !operations.is_empty());
    let Some(operations) = operations else {
        return Err(critical("the approved channel write carries no operations; nothing was written"));
    };
    operations
        .iter()
        .map(|operation| {
            let address = operation.get("channel_address").and_then(Value::as_str);
            let value = operation.get("value").cloned().map(serde_json::from_value::<ChannelValue>);
            match (address, value) {
                (Some(address), Some(Ok(value))) => Ok((address.to_owned(), value)),
                _ => Err(critical(format!("an approved channel write operation is not readable ({operation}); nothing was written"))),
            }
        })
        .collect()
}

/// Each approved operation's channel value as the approval showed it.
fn shown_values(payload: &Value) -> Vec<Option<ChannelValue>> {
    let operations = payload.get("operations").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    operations
        .iter()
        .map(|operation| operation.get("current_value").cloned().and_then(|value| serde_json::from_value(value).ok()))
        .collect()
}

fn limits_text(write: &PlannedWrite) -> String {
    let Some(limits) = &write.limits else { return "not listed".into() };
    let mut parts = Vec::new();
    if let Some(min) = limits.min_value {
        parts.push(format!("min {min}"));
    }
    if let Some(max) = limits.max_value {
        parts.push(format!("max {max}"));
    }
    if let Some(step) = limits.max_step {
        parts.push(format!("step ≤ {step}"));
    }
    if parts.is_empty() { "listed, no numeric limits".into() } else { parts.join(", ") }
}

fn verification_text(write: &PlannedWrite) -> String {
    match write.verification {
        peregrine_control::VerificationLevel::None => "none".into(),
        peregrine_control::VerificationLevel::Callback => "completion callback".into(),
        peregrine_control::VerificationLevel::Readback => format!("readback ± {}", write.tolerance),
    }
}

/// The approval request: every write with its current value, new value, limits and
/// verification; the payload is what the digest binds and what is written.
fn approval_request(
    task_objective: &str,
    planned: &[PlannedWrite],
    notes: &[Option<String>],
    decision: &ApprovalDecision,
) -> ApprovalRequest {
    let mut table = String::from("| Channel | Current | New | Limits | Verification |\n|---|---|---|---|---|\n");
    let mut operations = Vec::with_capacity(planned.len());
    for (write, note) in planned.iter().zip(notes) {
        let units = write.current.units.as_deref().map(|units| format!(" {units}")).unwrap_or_default();
        table.push_str(&format!(
            "| {} | {}{} | **{}**{} | {} | {} |\n",
            approval_cell(&write.address),
            approval_cell(&write.current.value.display()),
            approval_cell(&units),
            approval_cell(&write.value.display()),
            approval_cell(&units),
            approval_cell(&limits_text(write)),
            approval_cell(&verification_text(write)),
        ));
        operations.push(json!({
            "channel_address": write.address,
            "value": write.value,
            "current_value": write.current.value,
            "units": write.current.units,
            "limits": write.limits,
            "verification": write.verification,
            "tolerance": write.tolerance,
            "notes": note,
        }));
    }
    let count = planned.len();
    let body = format!(
        "**{count} control-system write{} to approve:**\n\n{table}\n\
         Exactly these values will be written. Just before writing, every channel is read and checked against its limits \
         again; if any check fails, nothing is written.\n_Why this asks: {}._",
        if count == 1 { "" } else { "s" },
        decision.reasoning
    );
    ApprovalRequest {
        approval_type: CHANNEL_WRITE_APPROVAL.into(),
        user_message: approval_message("Control-system write", Some(&approval_cell(task_objective)), &body),
        payload: json!({
            "approval_type": CHANNEL_WRITE_APPROVAL,
            // Names the operation's write journal: what a redelivered answer consults.
            "operation_id": uuid::Uuid::new_v4().to_string(),
            "step_objective": task_objective,
            "operations": operations,
        }),
    }
}

impl Capability for ChannelWriteCapability {
    fn spec(&self) -> &CapabilitySpec {
        &self.spec
    }

    async fn execute(&self, input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        if let Some(answer) = input.approval {
            return self.resume(&input, answer).await;
        }
        let settings = self.gates_for(&input);
        if !settings.writes_enabled {
            // The first gate, before the model is even asked what to write.
            let error = ControlError::WritesDisabled { address: "(any channel)".into() };
            write_event(&input, ChannelWriteStage::Blocked, "", String::new(), None, error.to_string());
            Self::status(&input, StatusLevel::Error, "Write stopped: writes to the control system are disabled");
            return Err(control_error(error));
        }
        let operations = self.operations(&input).await?;
        let gate = WriteGate::new(&settings, self.connector.as_ref());
        let typed = self.typed(&input, &gate, &operations).await?;
        let planned = match gate.plan(&typed).await {
            Ok(planned) => planned,
            Err(error) => {
                let address = error_address(&error, &typed);
                let value = typed.iter().find(|(candidate, _)| *candidate == address).map(|(_, value)| value.display()).unwrap_or_default();
                return Err(self.stopped(&input, &address, &value, error));
            }
        };
        let decision = self.services.settings.approval.control_write(input.state.agent_control.approval_mode);
        if decision.needs_approval {
            for write in &planned {
                write_event(
                    &input,
                    ChannelWriteStage::AwaitingApproval,
                    &write.address,
                    write.value.display(),
                    Some(write.current.value.display()),
                    limits_text(write),
                );
            }
            Self::status(&input, StatusLevel::Info, "Channel write needs approval");
            let notes: Vec<Option<String>> = operations.iter().map(|operation| operation.notes.clone()).collect();
            return Ok(CapabilityOutcome::NeedsApproval(approval_request(input.task_objective(), &planned, &notes, &decision)));
        }
        self.commit(&input, &settings, &typed, None, &[]).await
    }
}

/// The channel a gate error names (the first write when it names none).
fn error_address(error: &ControlError, typed: &[(String, ChannelValue)]) -> String {
    let named = match error {
        ControlError::Timeout { address, .. }
        | ControlError::Disconnected { address, .. }
        | ControlError::UnknownChannel { address }
        | ControlError::WritesDisabled { address }
        | ControlError::LimitViolation { address, .. }
        | ControlError::AccessDenied { address, .. }
        | ControlError::InvalidValue { address, .. }
        | ControlError::WriteUncertain { address, .. } => Some(address.clone()),
        _ => None,
    };
    named.or_else(|| typed.first().map(|(address, _)| address.clone())).unwrap_or_default()
}
