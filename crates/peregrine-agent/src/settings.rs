//! Framework settings every node reads: per-turn defaults, approval policy, limits, the
//! facility's timezone, the agent data directory, the classifier's mode and the prompt-history
//! budget. The CLI fills them from `config.yml`; applications and tests build them directly.

use std::path::PathBuf;
use std::time::Duration;

use peregrine_core::{AgentControl, ApprovalConfig, ExecutionLimits};
use serde::{Deserialize, Serialize};

use crate::history::DEFAULT_PROMPT_HISTORY_CHARS;

/// How the classifier decides which capabilities a task needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClassifierMode {
    /// One `CapabilitySelection` call decides every capability at once.
    #[default]
    Batched,
    /// Upstream's one `CapabilityMatch` yes/no call per capability (bounded concurrency).
    PerCapability,
}

/// Settings shared by the framework's nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSettings {
    /// Defaults of every turn's switches (`execution_control.agent_control`); the gateway sets
    /// `approval_mode` from `approval.global_mode` and applies slash commands on top.
    pub agent_control: AgentControl,
    /// `approval`.
    pub approval: ApprovalConfig,
    /// `execution_control.limits`.
    pub limits: ExecutionLimits,
    /// The facility's timezone (`system.timezone`); times are shown and parsed in it.
    pub timezone: chrono_tz::Tz,
    /// The agent data directory (`file_paths.agent_data_dir`): memory, pending plans.
    pub agent_data_dir: PathBuf,
    /// Classifier mode.
    pub classifier_mode: ClassifierMode,
    /// How long task extraction waits for all data sources together (upstream: 30 s).
    pub data_source_timeout: Duration,
    /// How many characters of conversation history a prompt may carry (default 24 000, about
    /// 6 000 tokens): task extraction, the orchestrator, clarify, respond and memory show the
    /// most recent messages that fit, always with the latest user message (cut with a marker
    /// when it alone is longer), and say how many earlier messages were left out. 0 means no
    /// history: prompts carry only the latest user message.
    pub prompt_history_chars: usize,
}

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            agent_control: AgentControl::default(),
            approval: ApprovalConfig::default(),
            limits: ExecutionLimits::default(),
            timezone: chrono_tz::UTC,
            agent_data_dir: PathBuf::from("_agent_data"),
            classifier_mode: ClassifierMode::default(),
            data_source_timeout: Duration::from_secs(30),
            prompt_history_chars: DEFAULT_PROMPT_HISTORY_CHARS,
        }
    }
}

impl AgentSettings {
    /// Settings with everything default but the data directory.
    pub fn with_data_dir(agent_data_dir: impl Into<PathBuf>) -> Self {
        Self { agent_data_dir: agent_data_dir.into(), ..Self::default() }
    }

    /// The switches a new turn starts with, before slash commands.
    pub fn turn_defaults(&self) -> AgentControl {
        AgentControl { approval_mode: self.approval.global_mode, ..self.agent_control.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_history_budget_is_about_six_thousand_tokens() {
        assert_eq!(AgentSettings::default().prompt_history_chars, 24_000);
        assert_eq!(AgentSettings::with_data_dir("/data").prompt_history_chars, DEFAULT_PROMPT_HISTORY_CHARS);
    }
}
