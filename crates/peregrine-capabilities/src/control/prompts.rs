//! The control-system capabilities' prompts and guides. Applications override any of them by
//! implementing [`ChannelPrompts`] (a facility names its own channels in the examples).

use peregrine_core::{ClassifierExample, ClassifierGuide, InputRef, OrchestratorExample, OrchestratorGuide, PlannedStep};
use peregrine_llm::ChatMessage;

use super::{CHANNEL_ADDRESSES, CHANNEL_READ_CAPABILITY, CHANNEL_VALUES, CHANNEL_WRITE_CAPABILITY, CHANNEL_WRITE_RESULTS};

/// What the write-parsing prompt is built from.
#[derive(Debug, Clone, Copy)]
pub struct WriteParsingRequest<'a> {
    /// The step objective.
    pub task_objective: &'a str,
    /// The channels the step's `CHANNEL_ADDRESSES` inputs name (the only ones it may write);
    /// empty when the plan gives none.
    pub channels: &'a [String],
    /// Summaries of the step's inputs, one `- {TYPE: key}: summary` line each; empty if none.
    pub step_inputs: &'a str,
}

/// The prompts of `channel_read` and `channel_write`; every method has a default.
pub trait ChannelPrompts: Send + Sync + 'static {
    /// When the classifier selects `channel_read`.
    fn read_classifier_guide(&self) -> ClassifierGuide {
        default_read_classifier_guide()
    }

    /// How the orchestrator plans `channel_read` steps.
    fn read_orchestrator_guide(&self) -> OrchestratorGuide {
        default_read_orchestrator_guide()
    }

    /// When the classifier selects `channel_write`.
    fn write_classifier_guide(&self) -> ClassifierGuide {
        default_write_classifier_guide()
    }

    /// How the orchestrator plans `channel_write` steps.
    fn write_orchestrator_guide(&self) -> OrchestratorGuide {
        default_write_orchestrator_guide()
    }

    /// The `ChannelAddressExtraction` call of a read step the plan gives no addresses.
    fn address_messages(&self, task_objective: &str) -> Vec<ChatMessage> {
        default_address_messages(task_objective)
    }

    /// The `WriteOperationsOutput` call.
    fn write_messages(&self, request: &WriteParsingRequest<'_>) -> Vec<ChatMessage> {
        default_write_messages(request)
    }
}

/// The default prompts.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultChannelPrompts;

impl ChannelPrompts for DefaultChannelPrompts {}

fn example(query: &str, result: bool, reason: &str) -> ClassifierExample {
    ClassifierExample { query: query.into(), result, reason: reason.into() }
}

fn planned(capability: &str, context_key: &str, objective: &str, output: &str, inputs: Vec<InputRef>) -> PlannedStep {
    PlannedStep {
        context_key: context_key.into(),
        capability: capability.into(),
        task_objective: objective.into(),
        success_criteria: "done".into(),
        expected_output: Some(output.into()),
        parameters: None,
        inputs,
    }
}

/// The default classifier guide of `channel_read`: live values of the machine.
pub fn default_read_classifier_guide() -> ClassifierGuide {
    ClassifierGuide {
        instructions: "Determine if the task needs the current (live) value of one or more control-system channels \
                       (process variables): a reading, a status, a setpoint as it is now."
            .into(),
        examples: vec![
            example("What is the beam current?", true, "Asks for a live value of the machine"),
            example("Read SR:DCCT:CURRENT and SR:RF:AMP", true, "Names channels to read"),
            example("Is the injector kicker on?", true, "A status is a channel's current value"),
            example("Set the RF amplitude to 55", false, "A write, not a read (channel_write)"),
            example("What was the beam current yesterday?", false, "Historical data comes from the archiver, not a live read"),
        ],
        actions_if_true: None,
    }
}

/// The default orchestrator guide of `channel_read`.
pub fn default_read_orchestrator_guide() -> OrchestratorGuide {
    OrchestratorGuide {
        instructions: format!(
            "**When to plan \"{CHANNEL_READ_CAPABILITY}\" steps:**\n\
             - When the user needs the current value of control-system channels (process variables)\n\n\
             **Step Structure:**\n\
             - context_key: a unique identifier, e.g. \"beam_current\"\n\
             - task_objective: the channels to read, by their exact addresses when the user gave them\n\
             - inputs: the {CHANNEL_ADDRESSES} of an earlier step when one found the channels\n\n\
             **Output: {CHANNEL_VALUES}**\n\
             - each channel's value, units, timestamp and alarm severity, for the respond step to quote"
        ),
        examples: vec![OrchestratorExample {
            step: planned(CHANNEL_READ_CAPABILITY, "beam_current", "Read the beam current SR:DCCT:CURRENT", CHANNEL_VALUES, Vec::new()),
            scenario_description: "Reading a live value".into(),
            context_requirements: None,
            notes: Some("Follow with a respond step that takes the CHANNEL_VALUES as input.".into()),
        }],
        priority: 10,
    }
}

/// The default classifier guide of `channel_write`: explicit requests to change a value.
pub fn default_write_classifier_guide() -> ClassifierGuide {
    ClassifierGuide {
        instructions: "Determine if the task explicitly asks to change (set, write, put, move, ramp) a value on the control \
                       system. Questions about values, and hypothetical changes, are not writes."
            .into(),
        examples: vec![
            example("Set the RF amplitude of cavity 2 to 55", true, "An explicit write of a setpoint"),
            example("Put SR:HCM:01:SP to 1.5", true, "Names the channel and the value"),
            example("Switch the injector kicker off", true, "Changing an enumerated state is a write"),
            example("What is the RF amplitude?", false, "A read"),
            example("What would happen if we raised the RF amplitude?", false, "Hypothetical, nothing to write"),
        ],
        actions_if_true: None,
    }
}

/// The default orchestrator guide of `channel_write`.
pub fn default_write_orchestrator_guide() -> OrchestratorGuide {
    OrchestratorGuide {
        instructions: format!(
            "**When to plan \"{CHANNEL_WRITE_CAPABILITY}\" steps:**\n\
             - Only when the user explicitly asks to change a value on the control system\n\n\
             Every write passes the master switch, the channel limits and (when approvals are on) the user's approval; a \
             write that a gate stops is reported, never planned again another way.\n\n\
             **Step Structure:**\n\
             - context_key: a unique identifier, e.g. \"set_rf_amplitude\"\n\
             - task_objective: the channel and the exact value, e.g. \"Set SR:RF:AMP to 55\"\n\
             - inputs: the {CHANNEL_ADDRESSES} of an earlier step when one found the channels\n\n\
             **Output: {CHANNEL_WRITE_RESULTS}**\n\
             - each write's old and new value and its verification, for the respond step to confirm"
        ),
        examples: vec![OrchestratorExample {
            step: planned(CHANNEL_WRITE_CAPABILITY, "set_rf_amplitude", "Set SR:RF:AMP to 55", CHANNEL_WRITE_RESULTS, Vec::new()),
            scenario_description: "Writing a setpoint the user named".into(),
            context_requirements: None,
            notes: Some("Follow with a respond step that takes the CHANNEL_WRITE_RESULTS as input.".into()),
        }],
        priority: 10,
    }
}

/// The default address-extraction prompt.
pub fn default_address_messages(task_objective: &str) -> Vec<ChatMessage> {
    vec![
        ChatMessage::system(
            "You list the control-system channel addresses (EPICS process variable names such as SR:DCCT:CURRENT) that a \
             task asks to read. Copy each address exactly as the task writes it; never invent one. If the task names no \
             address, answer with an empty list.",
        ),
        ChatMessage::user(format!("Task: {task_objective}")),
    ]
}

/// The default write-parsing prompt.
pub fn default_write_messages(request: &WriteParsingRequest<'_>) -> Vec<ChatMessage> {
    let system = "You turn a task into control-system write operations. For each write the task explicitly asks for, give \
                  the channel address exactly as written (an EPICS process variable name), the value (a number, or the \
                  state's label for an enumerated channel), the units the task states, and a short note. Never invent a \
                  channel or a value, never add writes the task does not ask for, and answer with no operations when the \
                  task is unclear.";
    let mut user = format!("Task: {}", request.task_objective);
    if !request.channels.is_empty() {
        user.push_str(&format!("\n\nChannels found for this task (write only these): {}", request.channels.join(", ")));
    }
    if !request.step_inputs.is_empty() {
        user.push_str(&format!("\n\nStep inputs (results of earlier steps):\n{}", request.step_inputs));
    }
    vec![ChatMessage::system(system), ChatMessage::user(user)]
}
