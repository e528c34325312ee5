//! Approval policy (reference §4.1): the `approval` section of `config.yml` and the decisions
//! that follow from it. The turn's [`ApprovalMode`] (config `approval.global_mode`, changed for
//! one turn by `/approval`) overrides the per-capability settings: `disabled` turns every
//! approval off, `all_capabilities` turns every one on, `selective` lets each setting decide.
//!
//! Upstream's `/approval` only changed a state field nothing read; here the turn's mode is what
//! every decision takes.

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use crate::state::ApprovalMode;

/// Which Python code needs approval (`approval.capabilities.python_execution.mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PythonApprovalMode {
    /// Never.
    Disabled,
    /// Code that writes to the control system (`epics_writes` is upstream's deprecated alias).
    #[default]
    #[serde(alias = "epics_writes")]
    ControlWrites,
    /// All code.
    AllCode,
}

/// `approval.capabilities.python_execution`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonApproval {
    /// Whether Python approvals are on at all.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Which code asks.
    #[serde(default)]
    pub mode: PythonApprovalMode,
}

impl Default for PythonApproval {
    fn default() -> Self {
        Self { enabled: true, mode: PythonApprovalMode::ControlWrites }
    }
}

/// A capability's approval switch (`approval.capabilities.memory`, `.channel_write`):
/// `{enabled: bool}` or a bare bool, as upstream accepts; on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ApprovalSwitch {
    /// Whether the action asks first.
    pub enabled: bool,
}

/// `approval.capabilities.memory`.
pub type MemoryApproval = ApprovalSwitch;

impl Default for ApprovalSwitch {
    fn default() -> Self {
        Self { enabled: true }
    }
}

impl<'de> Deserialize<'de> for ApprovalSwitch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Bare(bool),
            Table {
                #[serde(default = "yes")]
                enabled: bool,
            },
        }
        match Form::deserialize(deserializer) {
            Ok(Form::Bare(enabled) | Form::Table { enabled }) => Ok(Self { enabled }),
            Err(_) => Err(de::Error::custom("expected `true`, `false` or `{enabled: true|false}`")),
        }
    }
}

fn yes() -> bool {
    true
}

/// `approval.capabilities`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CapabilityApprovals {
    /// Python code execution (also governs control-system writes, as upstream).
    pub python_execution: PythonApproval,
    /// Memory saves.
    pub memory: MemoryApproval,
    /// Control-system writes (Peregrine's key; on unless set to false: then upstream's rule
    /// applies — the global mode, then `python_execution` as for code that writes).
    pub channel_write: ApprovalSwitch,
}

/// The `approval` section of `config.yml`. Missing parts take the secure defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApprovalConfig {
    /// The default mode of every turn.
    pub global_mode: ApprovalMode,
    /// Per-capability settings, read in `selective` mode.
    pub capabilities: CapabilityApprovals,
    /// Whether a chat's `/approval` may ask for *fewer* approvals than `global_mode` (it may
    /// always ask for more). Off by default: the operator's policy holds.
    pub allow_chat_override: bool,
}

/// Whether an action needs a person's approval, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalDecision {
    /// Ask first.
    pub needs_approval: bool,
    /// Why, for logs and the approval prompt.
    pub reasoning: String,
}

impl ApprovalDecision {
    fn new(needs_approval: bool, reasoning: impl Into<String>) -> Self {
        Self { needs_approval, reasoning: reasoning.into() }
    }
}

impl ApprovalConfig {
    fn by_mode(turn_mode: ApprovalMode) -> Option<ApprovalDecision> {
        match turn_mode {
            ApprovalMode::Disabled => Some(ApprovalDecision::new(false, "approvals are disabled for this turn")),
            ApprovalMode::AllCapabilities => Some(ApprovalDecision::new(true, "every action asks for approval (all_capabilities)")),
            ApprovalMode::Selective => None,
        }
    }

    /// Whether saving a memory asks first.
    pub fn memory_save(&self, turn_mode: ApprovalMode) -> ApprovalDecision {
        Self::by_mode(turn_mode).unwrap_or_else(|| {
            if self.capabilities.memory.enabled {
                ApprovalDecision::new(true, "memory saves ask for approval (approval.capabilities.memory.enabled)")
            } else {
                ApprovalDecision::new(false, "memory approval is disabled")
            }
        })
    }

    /// Whether running Python code asks first, given what its analysis found.
    pub fn python_execution(&self, turn_mode: ApprovalMode, has_control_writes: bool) -> ApprovalDecision {
        Self::by_mode(turn_mode).unwrap_or_else(|| {
            let python = self.capabilities.python_execution;
            match (python.enabled, python.mode) {
                (false, _) | (true, PythonApprovalMode::Disabled) => ApprovalDecision::new(false, "python approval is disabled"),
                (true, PythonApprovalMode::AllCode) => ApprovalDecision::new(true, "all code asks for approval (mode all_code)"),
                (true, PythonApprovalMode::ControlWrites) if has_control_writes => {
                    ApprovalDecision::new(true, "the code writes to the control system (mode control_writes)")
                }
                (true, PythonApprovalMode::ControlWrites) => ApprovalDecision::new(false, "read-only code (mode control_writes)"),
            }
        })
    }

    /// Whether a control-system write asks first: always, unless
    /// `approval.capabilities.channel_write` is set to false — no global mode, chat command or
    /// Python setting turns it off. Then upstream's rule: the Python evaluator with writes.
    pub fn control_write(&self, turn_mode: ApprovalMode) -> ApprovalDecision {
        if self.capabilities.channel_write.enabled {
            return ApprovalDecision::new(true, "control-system writes always ask for approval (approval.capabilities.channel_write)");
        }
        self.python_execution(turn_mode, true)
    }
}

/// The prompt shown for an approval: upstream's header, a title, the body, and how to answer.
pub fn approval_message(title: &str, task: Option<&str>, body: &str) -> String {
    let mut message = format!("⚠️ **HUMAN APPROVAL REQUIRED** ⚠️\n\n**{title}**\n");
    if let Some(task) = task.filter(|task| !task.trim().is_empty()) {
        message.push_str(&format!("\n**Task:** {task}\n"));
    }
    message.push('\n');
    message.push_str(body.trim_end());
    message.push_str("\n\n**To proceed, respond with:**\n- **`yes`** to approve\n- **`no`** to cancel");
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_writes_ask_whatever_the_mode_unless_their_own_switch_is_off() {
        let mut config = ApprovalConfig::default();
        config.capabilities.python_execution.enabled = false;
        for mode in [ApprovalMode::Disabled, ApprovalMode::Selective, ApprovalMode::AllCapabilities] {
            assert!(config.control_write(mode).needs_approval, "{mode:?}");
        }
        config.capabilities.channel_write.enabled = false;
        assert!(!config.control_write(ApprovalMode::Selective).needs_approval, "then upstream's python rule decides");
        assert!(config.control_write(ApprovalMode::AllCapabilities).needs_approval);
        let read: ApprovalConfig = serde_json::from_value(serde_json::json!({"capabilities": {"channel_write": false}})).expect("reads");
        assert!(!read.capabilities.channel_write.enabled);
        assert!(ApprovalConfig::default().capabilities.channel_write.enabled, "on by default");
    }

    #[test]
    fn osprey_approval_sections_parse_with_secure_defaults() {
        let config: ApprovalConfig = serde_json::from_value(serde_json::json!({
            "global_mode": "selective",
            "capabilities": {"python_execution": {"enabled": true, "mode": "epics_writes"}, "memory": false}
        }))
        .expect("parses");
        assert_eq!(config.capabilities.python_execution.mode, PythonApprovalMode::ControlWrites);
        assert!(!config.capabilities.memory.enabled);
        let empty: ApprovalConfig = serde_json::from_value(serde_json::json!({})).expect("parses");
        assert_eq!(empty.global_mode, ApprovalMode::Selective);
        assert!(empty.capabilities.memory.enabled && empty.capabilities.python_execution.enabled);
        let table: ApprovalConfig =
            serde_json::from_value(serde_json::json!({"capabilities": {"memory": {"enabled": false}}})).expect("parses");
        assert!(!table.capabilities.memory.enabled);
        let bad = serde_json::from_value::<ApprovalConfig>(serde_json::json!({"global_mode": "sometimes"}));
        assert!(bad.is_err());
        let bad_memory = serde_json::from_value::<ApprovalConfig>(serde_json::json!({"capabilities": {"memory": "yes"}}));
        assert!(bad_memory.expect_err("refused").to_string().contains("enabled: true|false"));
    }

    #[test]
    fn the_turn_mode_overrides_per_capability_settings() {
        let mut config = ApprovalConfig::default();
        assert!(config.memory_save(ApprovalMode::Selective).needs_approval);
        assert!(!config.memory_save(ApprovalMode::Disabled).needs_approval);
        config.capabilities.memory.enabled = false;
        assert!(!config.memory_save(ApprovalMode::Selective).needs_approval);
        assert!(config.memory_save(ApprovalMode::AllCapabilities).needs_approval);
        assert!(config.python_execution(ApprovalMode::Selective, true).needs_approval);
        assert!(!config.python_execution(ApprovalMode::Selective, false).needs_approval);
        config.capabilities.python_execution.mode = PythonApprovalMode::AllCode;
        assert!(config.python_execution(ApprovalMode::Selective, false).needs_approval);
        assert!(!config.python_execution(ApprovalMode::Disabled, true).needs_approval);
    }

    #[test]
    fn approval_prompts_say_how_to_answer() {
        let message = approval_message("Memory save", Some("remember my shift"), "Content: shift B");
        assert!(message.starts_with("⚠️ **HUMAN APPROVAL REQUIRED** ⚠️"));
        assert!(message.contains("**Task:** remember my shift") && message.contains("`yes`") && message.contains("`no`"));
    }
}
