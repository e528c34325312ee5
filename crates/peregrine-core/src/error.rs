//! Error severities, classifications, retry policies and execution limits: the vocabulary the
//! router turns into recoveries (retry, re-plan, re-classify, report, abort).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How bad an error is, which decides the router's recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorSeverity {
    /// Transient: run the same node again after a backoff, within its retry policy.
    Retriable,
    /// The approach failed: build a new plan, within `max_planning_attempts`.
    Replanning,
    /// The wrong capabilities were selected: classify again, within `max_reclassifications`.
    Reclassification,
    /// End the turn gracefully with an error report.
    Critical,
    /// System integrity is at stake: abort the run at once, keeping the last checkpoint.
    Fatal,
}

impl ErrorSeverity {
    /// The lower-case name used in config, logs and persisted state.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retriable => "retriable",
            Self::Replanning => "replanning",
            Self::Reclassification => "reclassification",
            Self::Critical => "critical",
            Self::Fatal => "fatal",
        }
    }
}

impl fmt::Display for ErrorSeverity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str().to_uppercase())
    }
}

/// A classified error: what the router should do, what the user is told, and details for
/// re-planning prompts and error reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorClassification {
    /// The recovery class.
    pub severity: ErrorSeverity,
    /// A sentence for the user (and the re-planning prompt).
    pub user_message: Option<String>,
    /// Conventional keys: `technical_details`, `replanning_reason`, `safety_abort_reason`,
    /// `suggestions`. Kept sorted so prompts and reports are deterministic (a `BTreeMap`, not
    /// `serde_json::Map`, whose order a dependency can change by turning on `preserve_order`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, Value>,
}

impl ErrorClassification {
    /// A classification with a user message and no metadata.
    pub fn new(severity: ErrorSeverity, user_message: impl Into<String>) -> Self {
        Self { severity, user_message: Some(user_message.into()), metadata: std::collections::BTreeMap::new() }
    }

    /// Shorthand for [`ErrorSeverity::Retriable`].
    pub fn retriable(user_message: impl Into<String>) -> Self {
        Self::new(ErrorSeverity::Retriable, user_message)
    }

    /// Shorthand for [`ErrorSeverity::Replanning`].
    pub fn replanning(user_message: impl Into<String>) -> Self {
        Self::new(ErrorSeverity::Replanning, user_message)
    }

    /// Shorthand for [`ErrorSeverity::Reclassification`].
    pub fn reclassification(user_message: impl Into<String>) -> Self {
        Self::new(ErrorSeverity::Reclassification, user_message)
    }

    /// Shorthand for [`ErrorSeverity::Critical`].
    pub fn critical(user_message: impl Into<String>) -> Self {
        Self::new(ErrorSeverity::Critical, user_message)
    }

    /// Shorthand for [`ErrorSeverity::Fatal`].
    pub fn fatal(user_message: impl Into<String>) -> Self {
        Self::new(ErrorSeverity::Fatal, user_message)
    }

    /// Adds one metadata entry.
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// The block fed to re-planning prompts and error reports:
    ///
    /// ```text
    /// **Previous Execution Error:**
    /// - **User Message:** <message>
    /// - **Technical Details:** <value>
    /// ```
    ///
    /// Lists are comma-joined, objects pretty-printed as JSON, strings written as they are.
    pub fn format_for_llm(&self) -> String {
        let mut out = String::from("**Previous Execution Error:**\n");
        let message = self.user_message.as_deref().unwrap_or("No error message available");
        out.push_str(&format!("- **User Message:** {message}"));
        for (key, value) in &self.metadata {
            out.push_str(&format!("\n- **{}:** {}", title_case(key), format_metadata_value(value)));
        }
        out
    }
}

fn title_case(key: &str) -> String {
    key.split('_')
        .filter(|word| !word.is_empty())
        .map(|word| {
            let mut chars = word.chars();
            match chars.next() {
                Some(first) => first.to_uppercase().chain(chars).collect::<String>(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn format_metadata_value(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Array(items) => items.iter().map(format_metadata_value).collect::<Vec<_>>().join(", "),
        Value::Object(_) => serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string()),
        other => other.to_string(),
    }
}

/// How often and how patiently a failing node is retried.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Total executions allowed, the first one included.
    pub max_attempts: u32,
    /// Wait before the first retry.
    #[serde(rename = "delay_seconds", with = "duration_secs")]
    pub delay: Duration,
    /// Each further retry waits this factor longer.
    pub backoff_factor: f64,
    /// No wait is ever longer than this.
    #[serde(rename = "max_delay_seconds", with = "duration_secs", default = "default_max_delay")]
    pub max_delay: Duration,
}

fn default_max_delay() -> Duration {
    Duration::from_secs(60)
}

impl RetryPolicy {
    /// A policy with the default cap on a single wait (60 s).
    pub fn new(max_attempts: u32, delay_seconds: f64, backoff_factor: f64) -> Self {
        Self { max_attempts, delay: Duration::from_secs_f64(delay_seconds.max(0.0)), backoff_factor, max_delay: default_max_delay() }
    }

    /// Default for capabilities: 3 attempts, 0.5 s, ×1.5.
    pub fn capability_default() -> Self {
        Self::new(3, 0.5, 1.5)
    }

    /// Default for infrastructure nodes: 2 attempts, 0.2 s, ×1.2.
    pub fn infrastructure_default() -> Self {
        Self::new(2, 0.2, 1.2)
    }

    /// Task extraction: 3 attempts, 1.0 s, ×1.5.
    pub fn task_extraction() -> Self {
        Self::new(3, 1.0, 1.5)
    }

    /// Classifier: 4 attempts, 1.0 s, ×1.8.
    pub fn classifier() -> Self {
        Self::new(4, 1.0, 1.8)
    }

    /// Orchestrator: 4 attempts, 2.0 s, ×2.0.
    pub fn orchestrator() -> Self {
        Self::new(4, 2.0, 2.0)
    }

    /// Wait before the retry that follows failure number `failures` (1-based):
    /// `delay × backoff^(failures−1)`, capped at `max_delay`. Zero failures wait nothing.
    pub fn delay_after(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let exponent = i32::try_from(failures - 1).unwrap_or(i32::MAX);
        let seconds = self.delay.as_secs_f64() * self.backoff_factor.powi(exponent);
        if !seconds.is_finite() || seconds >= self.max_delay.as_secs_f64() {
            self.max_delay
        } else {
            Duration::from_secs_f64(seconds.max(0.0))
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::capability_default()
    }
}

/// Every limit of `execution_control.limits`; each one is enforced (see the field docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutionLimits {
    /// Re-classifications allowed per turn (router).
    pub max_reclassifications: u32,
    /// Plans allowed per turn, failed planning attempts included (router).
    pub max_planning_attempts: u32,
    /// Retries allowed per step on top of the first execution; caps every node's own
    /// `RetryPolicy::max_attempts` (router).
    pub max_step_retries: u32,
    /// Wall-clock budget of one run, excluding time paused at an approval (graph engine).
    pub max_execution_time_seconds: u64,
    /// Node executions allowed per run (graph engine).
    pub graph_recursion_limit: u32,
    /// Concurrent classifier LLM calls ([`crate::concurrency::run_bounded`]).
    pub max_concurrent_classifications: usize,
}

impl Default for ExecutionLimits {
    fn default() -> Self {
        Self {
            max_reclassifications: 1,
            max_planning_attempts: 2,
            max_step_retries: 3,
            max_execution_time_seconds: 300,
            graph_recursion_limit: 100,
            max_concurrent_classifications: 5,
        }
    }
}

/// A limit that cannot work as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("execution_control.limits.{field} = {value} is invalid: {reason}")]
pub struct InvalidLimit {
    /// The config key.
    pub field: &'static str,
    /// The rejected value.
    pub value: String,
    /// Why, and what to set instead.
    pub reason: &'static str,
}

impl ExecutionLimits {
    /// Checks that every limit can be honoured; zero budgets that would stop every turn are refused.
    pub fn validate(&self) -> Result<(), InvalidLimit> {
        let checks: [(&'static str, u64, &'static str); 4] = [
            ("max_planning_attempts", u64::from(self.max_planning_attempts), "at least one plan is needed per turn; use 1 or more"),
            ("max_execution_time_seconds", self.max_execution_time_seconds, "a run needs time to finish; use 1 or more"),
            ("graph_recursion_limit", u64::from(self.graph_recursion_limit), "a turn needs at least a few steps; use 10 or more"),
            (
                "max_concurrent_classifications",
                self.max_concurrent_classifications as u64,
                "the classifier needs at least one call at a time; use 1 or more",
            ),
        ];
        for (field, value, reason) in checks {
            if value == 0 {
                return Err(InvalidLimit { field, value: value.to_string(), reason });
            }
        }
        Ok(())
    }

    /// The wall-clock budget as a duration.
    pub fn max_execution_time(&self) -> Duration {
        Duration::from_secs(self.max_execution_time_seconds)
    }

    /// Executions a node with `policy` may have for one step: its own policy, capped by
    /// `max_step_retries + 1`.
    pub fn effective_attempts(&self, policy: &RetryPolicy) -> u32 {
        policy.max_attempts.min(self.max_step_retries.saturating_add(1))
    }
}

/// Serde for durations as fractional seconds, the unit config files use.
pub mod duration_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes seconds as a float.
    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(value.as_secs_f64())
    }

    /// Reads non-negative float seconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let seconds = f64::deserialize(deserializer)?;
        Duration::try_from_secs_f64(seconds)
            .map_err(|_| serde::de::Error::custom(format!("{seconds} is not a valid number of seconds (must be finite and ≥ 0)")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_for_llm_matches_reference_layout() {
        let classification = ErrorClassification::replanning("Channel not found")
            .with_metadata("technical_details", "PV SR:XX timed out")
            .with_metadata("suggestions", serde_json::json!(["use channel_finding", "check spelling"]))
            .with_metadata("replanning_reason", serde_json::json!({"missing": "CHANNEL_ADDRESSES"}));
        let text = classification.format_for_llm();
        assert_eq!(
            text,
            "**Previous Execution Error:**\n- **User Message:** Channel not found\n\
             - **Replanning Reason:** {\n  \"missing\": \"CHANNEL_ADDRESSES\"\n}\n\
             - **Suggestions:** use channel_finding, check spelling\n\
             - **Technical Details:** PV SR:XX timed out"
        );
    }

    #[test]
    fn format_for_llm_without_message() {
        let classification = ErrorClassification { severity: ErrorSeverity::Critical, user_message: None, metadata: Default::default() };
        assert_eq!(classification.format_for_llm(), "**Previous Execution Error:**\n- **User Message:** No error message available");
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let policy = RetryPolicy::new(3, 0.5, 1.5);
        assert_eq!(policy.delay_after(0), Duration::ZERO);
        assert_eq!(policy.delay_after(1), Duration::from_millis(500));
        assert_eq!(policy.delay_after(2), Duration::from_millis(750));
        let capped = RetryPolicy { max_delay: Duration::from_secs(1), ..RetryPolicy::new(10, 0.5, 10.0) };
        assert_eq!(capped.delay_after(5), Duration::from_secs(1));
    }

    #[test]
    fn node_default_policies_match_reference() {
        let table = [
            (RetryPolicy::capability_default(), 3, 0.5, 1.5),
            (RetryPolicy::infrastructure_default(), 2, 0.2, 1.2),
            (RetryPolicy::task_extraction(), 3, 1.0, 1.5),
            (RetryPolicy::classifier(), 4, 1.0, 1.8),
            (RetryPolicy::orchestrator(), 4, 2.0, 2.0),
        ];
        for (policy, attempts, delay, backoff) in table {
            assert_eq!((policy.max_attempts, policy.delay.as_secs_f64(), policy.backoff_factor), (attempts, delay, backoff));
        }
    }

    #[test]
    fn limits_defaults_validate_and_cap_attempts() {
        let limits = ExecutionLimits::default();
        assert_eq!(limits.validate(), Ok(()));
        assert_eq!(limits.effective_attempts(&RetryPolicy::classifier()), 4);
        let strict = ExecutionLimits { max_step_retries: 1, ..limits };
        assert_eq!(strict.effective_attempts(&RetryPolicy::classifier()), 2);
        let broken = ExecutionLimits { graph_recursion_limit: 0, ..limits };
        let error = broken.validate().expect_err("zero recursion limit must be refused");
        assert_eq!(error.field, "graph_recursion_limit");
    }

    #[test]
    fn retry_policy_round_trips_in_config_units() {
        let json = serde_json::json!({"max_attempts": 3, "delay_seconds": 0.5, "backoff_factor": 1.5});
        let policy: RetryPolicy = serde_json::from_value(json).expect("valid policy");
        assert_eq!(policy, RetryPolicy::capability_default());
        let bad = serde_json::json!({"max_attempts": 3, "delay_seconds": -1.0, "backoff_factor": 1.5});
        assert!(serde_json::from_value::<RetryPolicy>(bad).is_err());
    }
}
