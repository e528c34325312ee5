//! The serde model of `config.yml` as written: the sections Peregrine reads, the Osprey keys it
//! accepts and ignores, and value types whose errors say what is expected.
//!
//! Sections Peregrine owns deny unknown keys, so a typo (`max_token`) is an error; Osprey's own
//! sections (`api.providers.<name>`, `system`, `file_paths`, `logging`, `development`) accept
//! extra keys, which are reported as ignored. Keys not declared here are skipped by serde and
//! recorded by the interpolating deserializer ([`super::de`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use peregrine_agent::ClassifierMode;
use peregrine_core::{ApprovalConfig, ExecutionLimits};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// The whole file. Unknown top-level keys are skipped (and reported as ignored).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub models: Option<BTreeMap<String, RawModel>>,
    #[serde(default)]
    pub api: Option<RawApi>,
    #[serde(default)]
    pub approval: Option<ApprovalConfig>,
    #[serde(default)]
    pub execution_control: Option<RawExecutionControl>,
    #[serde(default)]
    pub system: Option<RawSystem>,
    #[serde(default)]
    pub file_paths: Option<RawFilePaths>,
    #[serde(default)]
    pub checkpointer: Option<RawCheckpointer>,
    #[serde(default)]
    pub capabilities: Option<RawCapabilities>,
    #[serde(default)]
    pub server: Option<RawServer>,
    #[serde(default)]
    pub logging: Option<RawLogging>,
    #[serde(default)]
    pub development: Option<RawDevelopment>,
    #[serde(default)]
    pub control_system: Option<RawControlSystem>,
}

/// `control_system` (Osprey's section; keys Peregrine does not read are reported as ignored).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawControlSystem {
    #[serde(default, rename = "type")]
    pub kind: Option<ControlSystemKind>,
    #[serde(default)]
    pub writes_enabled: Option<bool>,
    #[serde(default)]
    pub limits_checking: Option<RawLimitsChecking>,
    #[serde(default)]
    pub write_verification: Option<RawWriteVerification>,
    #[serde(default)]
    pub connector: Option<RawConnectors>,
}

/// `control_system.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ControlSystemKind {
    Mock,
    Epics,
}

/// `control_system.limits_checking`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawLimitsChecking {
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub database_path: Option<String>,
    #[serde(default)]
    pub allow_unlisted_channels: Option<bool>,
    #[serde(default)]
    pub on_violation: Option<OnViolation>,
}

/// `control_system.limits_checking.on_violation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnViolation {
    Error,
    Skip,
}

/// `control_system.write_verification`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawWriteVerification {
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub default_level: Option<peregrine_control::VerificationLevel>,
    #[serde(default)]
    pub default_tolerance_percent: Option<f64>,
    #[serde(default)]
    pub timeout: Option<Seconds>,
}

/// `control_system.connector`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawConnectors {
    #[serde(default)]
    pub mock: Option<RawMockConnector>,
    #[serde(default)]
    pub epics: Option<RawEpicsConnector>,
}

/// `control_system.connector.mock`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawMockConnector {
    #[serde(default)]
    pub noise_level: Option<f64>,
    #[serde(default)]
    pub seed: Option<Count>,
}

/// `control_system.connector.epics`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawEpicsConnector {
    #[serde(default)]
    pub timeout: Option<Seconds>,
    /// Peregrine's: the CA servers to search (`EPICS_CA_ADDR_LIST` overrides it).
    #[serde(default)]
    pub addr_list: Option<Vec<String>>,
    /// Peregrine's: whether to search the broadcast addresses too (`EPICS_CA_AUTO_ADDR_LIST`).
    #[serde(default)]
    pub auto_addr_list: Option<bool>,
    /// Peregrine's: the CA server port (`EPICS_CA_SERVER_PORT`).
    #[serde(default)]
    pub server_port: Option<Count>,
    #[serde(default)]
    pub gateways: Option<RawGateways>,
}

/// `control_system.connector.epics.gateways`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawGateways {
    #[serde(default)]
    pub read_only: Option<RawGateway>,
    #[serde(default)]
    pub write_access: Option<RawGateway>,
}

/// One CA gateway.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawGateway {
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub port: Option<Count>,
}

/// `models.<role>`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawModel {
    pub provider: String,
    pub model_id: String,
    #[serde(default)]
    pub max_tokens: Option<PositiveCount>,
    #[serde(default)]
    pub temperature: Option<Temperature>,
}

/// `api`: only `providers` is read.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawApi {
    #[serde(default)]
    pub providers: Option<BTreeMap<String, Option<RawProvider>>>,
}

/// `api.providers.<name>`; Osprey's extras (`host`, `port`, …) are ignored.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawProvider {
    #[serde(default)]
    pub api_key: Option<String>,
    #[serde(default)]
    pub base_url: Option<String>,
    #[serde(default)]
    pub timeout_seconds: Option<Seconds>,
    #[serde(default)]
    pub max_retries: Option<Count>,
    #[serde(default)]
    pub model_path: Option<String>,
    #[serde(default)]
    pub protocol: Option<Protocol>,
}

/// The keys of `api.providers.<name>` Peregrine reads.
pub(crate) const PROVIDER_KEYS: &[&str] = &["api_key", "base_url", "timeout_seconds", "max_retries", "model_path", "protocol"];

/// A provider's wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Protocol {
    Openai,
    Anthropic,
    Ollama,
    Local,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Self::Openai => "openai",
            Self::Anthropic => "anthropic",
            Self::Ollama => "ollama",
            Self::Local => "local",
        }
    }
}

/// `execution_control`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawExecutionControl {
    #[serde(default)]
    pub agent_control: Option<RawAgentControl>,
    #[serde(default)]
    pub limits: Option<ExecutionLimits>,
    #[serde(default)]
    pub classifier_mode: Option<ClassifierMode>,
    #[serde(default)]
    pub prompt_history_chars: Option<Count>,
    #[serde(default)]
    pub data_source_timeout_seconds: Option<Seconds>,
    /// Upstream's legacy `execution_control.epics.writes_enabled`: read only to warn that it
    /// enables nothing (the master switch is `control_system.writes_enabled`).
    #[serde(default)]
    pub epics: Option<RawLegacyEpics>,
}

/// `execution_control.epics` (Osprey's legacy write switch; other keys ignored).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawLegacyEpics {
    #[serde(default)]
    pub writes_enabled: Option<bool>,
}

/// `execution_control.agent_control`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgentControl {
    #[serde(default)]
    pub planning_mode_enabled: Option<bool>,
    #[serde(default)]
    pub task_extraction_bypass_enabled: Option<bool>,
    #[serde(default)]
    pub capability_selection_bypass_enabled: Option<bool>,
    #[serde(default)]
    pub orchestration_mode: Option<OrchestrationMode>,
}

/// `execution_control.agent_control.orchestration_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OrchestrationMode {
    PlanFirst,
    React,
}

/// `system`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawSystem {
    #[serde(default)]
    pub timezone: Option<Timezone>,
}

/// `file_paths`: only `agent_data_dir` is read.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawFilePaths {
    #[serde(default)]
    pub agent_data_dir: Option<String>,
}

/// `checkpointer` (Peregrine's own section).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCheckpointer {
    #[serde(default, rename = "type")]
    pub kind: Option<CheckpointerKind>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub pool_size: Option<PositiveCount>,
}

/// `capabilities` (Peregrine's own section): which of the framework's built-in capabilities
/// an application leaves out.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCapabilities {
    #[serde(default)]
    pub exclude: Option<Vec<String>>,
}

/// `server` (Peregrine's own section): `peregrine serve`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub port: Option<Count>,
    #[serde(default)]
    pub api_keys: Option<Vec<String>>,
    #[serde(default)]
    pub max_body_bytes: Option<PositiveCount>,
    /// `reasoning`, `content` or `off`; `true` and `false` (the booleans of earlier versions) read
    /// as `reasoning` and `off`.
    #[serde(default)]
    pub max_message_bytes: Option<PositiveCount>,
    #[serde(default)]
    pub max_turns_in_flight: Option<PositiveCount>,
    #[serde(default)]
    pub max_connections: Option<PositiveCount>,
    #[serde(default)]
    pub header_timeout_seconds: Option<PositiveCount>,
    #[serde(default)]
    pub body_timeout_seconds: Option<PositiveCount>,
    #[serde(default)]
    pub allowed_origins: Option<Vec<String>>,
    #[serde(default)]
    pub status_lines: Option<peregrine_server::StatusLines>,
}

/// `checkpointer.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CheckpointerKind {
    Sqlite,
    Postgres,
    Memory,
}

/// `logging`: `level` and `file` are Peregrine's; Osprey's console options are ignored.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawLogging {
    #[serde(default)]
    pub level: Option<String>,
    #[serde(default)]
    pub file: Option<String>,
}

/// `development`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawDevelopment {
    #[serde(default)]
    pub raise_raw_errors: Option<bool>,
    #[serde(default)]
    pub api_calls: Option<RawApiCalls>,
}

/// `development.api_calls`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawApiCalls {
    #[serde(default)]
    pub save_all: Option<bool>,
}

/// The keys each lenient section reads, for "did you mean" hints on ignored keys.
pub(crate) fn known_keys(section: &str) -> &'static [&'static str] {
    match section {
        "" => &[
            "models",
            "api",
            "approval",
            "execution_control",
            "system",
            "file_paths",
            "checkpointer",
            "capabilities",
            "logging",
            "development",
            "control_system",
        ],
        "api" => &["providers"],
        "control_system" => &["type", "writes_enabled", "limits_checking", "write_verification", "connector"],
        "control_system.limits_checking" => &["enabled", "database_path", "allow_unlisted_channels", "on_violation"],
        "control_system.write_verification" => &["enabled", "default_level", "default_tolerance_percent", "timeout"],
        "control_system.connector" => &["mock", "epics"],
        "control_system.connector.mock" => &["noise_level", "seed"],
        "control_system.connector.epics" => &["timeout", "addr_list", "auto_addr_list", "server_port", "gateways"],
        "control_system.connector.epics.gateways" => &["read_only", "write_access"],
        "system" => &["timezone"],
        "file_paths" => &["agent_data_dir"],
        "logging" => &["level", "file"],
        "development" => &["raise_raw_errors", "api_calls"],
        "development.api_calls" => &["save_all"],
        "approval" => &["global_mode", "capabilities", "allow_chat_override"],
        "approval.capabilities" => &["python_execution", "memory", "channel_write"],
        _ if section.starts_with("api.providers.") => PROVIDER_KEYS,
        _ => &[],
    }
}

/// A whole number of at least 1 (`max_tokens`, `pool_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PositiveCount(pub u32);

impl<'de> Deserialize<'de> for PositiveCount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Expect;
        impl Visitor<'_> for Expect {
            type Value = PositiveCount;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a positive integer (such as 4096)")
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<PositiveCount, E> {
                match u32::try_from(value) {
                    Ok(value) if value > 0 => Ok(PositiveCount(value)),
                    _ => Err(E::invalid_value(de::Unexpected::Unsigned(value), &self)),
                }
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<PositiveCount, E> {
                match u64::try_from(value) {
                    Ok(value) => self.visit_u64(value),
                    Err(_) => Err(E::invalid_value(de::Unexpected::Signed(value), &self)),
                }
            }
        }
        deserializer.deserialize_u64(Expect)
    }
}

/// A whole number of 0 or more (`max_retries`, `prompt_history_chars`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Count(pub u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Expect;
        impl Visitor<'_> for Expect {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number (0 or more)")
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Count, E> {
                Ok(Count(value))
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Count, E> {
                u64::try_from(value).map(Count).map_err(|_| E::invalid_value(de::Unexpected::Signed(value), &self))
            }
        }
        deserializer.deserialize_u64(Expect)
    }
}

/// The longest timeout (one day): longer waits are hangs in all but name.
const MAX_SECONDS: f64 = 86_400.0;

/// A positive number of seconds, at most [`MAX_SECONDS`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Seconds(pub f64);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Expect;
        impl Visitor<'_> for Expect {
            type Value = Seconds;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a positive number of seconds up to 86400, one day (such as 120)")
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Seconds, E> {
                if value.is_finite() && value > 0.0 && value <= MAX_SECONDS {
                    Ok(Seconds(value))
                } else {
                    Err(E::invalid_value(de::Unexpected::Float(value), &self))
                }
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Seconds, E> {
                self.visit_f64(value as f64)
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Seconds, E> {
                self.visit_f64(value as f64)
            }
        }
        deserializer.deserialize_f64(Expect)
    }
}

/// A sampling temperature from 0 to 2.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Temperature(pub f32);

impl<'de> Deserialize<'de> for Temperature {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Expect;
        impl Visitor<'_> for Expect {
            type Value = Temperature;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number from 0 to 2 (such as 0.0)")
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Temperature, E> {
                if (0.0..=2.0).contains(&value) {
                    Ok(Temperature(value as f32))
                } else {
                    Err(E::invalid_value(de::Unexpected::Float(value), &self))
                }
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Temperature, E> {
                self.visit_f64(value as f64)
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Temperature, E> {
                self.visit_f64(value as f64)
            }
        }
        deserializer.deserialize_f64(Expect)
    }
}

/// An IANA timezone (`system.timezone`). Also takes the forms a `TZ` variable may hold:
/// `:America/Chicago`, `/usr/share/zoneinfo/America/Chicago`, and a zone file such as
/// `:/etc/localtime`, whose name is read from the link it is (`…/zoneinfo/Europe/Paris`). A zone
/// file that is not such a link cannot be named: UTC is used, and the caller warns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Timezone {
    /// The zone.
    pub zone: chrono_tz::Tz,
    /// The zone file given, when it could not be read and `zone` is UTC instead.
    pub unreadable_file: Option<String>,
}

/// Why a timezone text names no zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimezoneProblem {
    /// Not a name chrono-tz knows.
    Unknown,
    /// A path to a zone file that is not a link into a `zoneinfo` directory.
    UnreadableFile,
}

impl Timezone {
    /// The zone `text` names.
    pub fn resolve(text: &str) -> Result<chrono_tz::Tz, TimezoneProblem> {
        let name = text.trim().trim_start_matches(':');
        if let Some(zone) = zoneinfo_name(name) {
            return zone.parse().map_err(|_| TimezoneProblem::Unknown);
        }
        if name.starts_with('/') {
            return zone_of_link(Path::new(name)).ok_or(TimezoneProblem::UnreadableFile);
        }
        name.parse().map_err(|_| TimezoneProblem::Unknown)
    }
}

/// `Europe/Paris` of `/usr/share/zoneinfo/Europe/Paris` (or of `…/zoneinfo/posix/Europe/Paris`).
fn zoneinfo_name(path: &str) -> Option<&str> {
    let (_, name) = path.rsplit_once("zoneinfo/")?;
    Some(name.strip_prefix("posix/").or_else(|| name.strip_prefix("right/")).unwrap_or(name))
}

/// The zone of a zone file that is a link (followed a few hops) into a `zoneinfo` directory.
fn zone_of_link(path: &Path) -> Option<chrono_tz::Tz> {
    let mut current = path.to_owned();
    for _ in 0..8 {
        let target = std::fs::read_link(&current).ok()?;
        if let Some(zone) = target.to_str().and_then(zoneinfo_name).and_then(|name| name.parse().ok()) {
            return Some(zone);
        }
        current = current.parent().map_or_else(|| target.clone(), |parent| parent.join(&target));
    }
    None
}

impl<'de> Deserialize<'de> for Timezone {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Expect;
        impl Visitor<'_> for Expect {
            type Value = Timezone;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an IANA timezone name such as America/Los_Angeles, Europe/Berlin or UTC")
            }
            fn visit_str<E: de::Error>(self, value: &str) -> Result<Timezone, E> {
                match Timezone::resolve(value) {
                    Ok(zone) => Ok(Timezone { zone, unreadable_file: None }),
                    Err(TimezoneProblem::UnreadableFile) => {
                        Ok(Timezone { zone: chrono_tz::UTC, unreadable_file: Some(value.trim().to_owned()) })
                    }
                    Err(TimezoneProblem::Unknown) => Err(E::custom(format!(
                        "unknown timezone `{value}`; expected an IANA timezone name such as America/Los_Angeles, Europe/Berlin or UTC"
                    ))),
                }
            }
        }
        deserializer.deserialize_str(Expect)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tz_forms_resolve() {
        let dir = tempfile::tempdir().expect("temp dir");
        let direct = dir.path().join("direct");
        std::os::unix::fs::symlink("../usr/share/zoneinfo/posix/Asia/Tokyo", &direct).expect("symlink");
        let chained = dir.path().join("chained");
        std::os::unix::fs::symlink(&direct, &chained).expect("symlink");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "TZif").expect("write");
        let cases = [
            ("Europe/Paris".to_owned(), Ok(chrono_tz::Europe::Paris)),
            (":America/Chicago".to_owned(), Ok(chrono_tz::America::Chicago)),
            ("/usr/share/zoneinfo/Asia/Tokyo".to_owned(), Ok(chrono_tz::Asia::Tokyo)),
            (format!(":{}", direct.display()), Ok(chrono_tz::Asia::Tokyo)),
            (chained.display().to_string(), Ok(chrono_tz::Asia::Tokyo)),
            (format!(":{}", plain.display()), Err(TimezoneProblem::UnreadableFile)),
            (":/nonexistent/localtime".to_owned(), Err(TimezoneProblem::UnreadableFile)),
            ("Mars/Olympus_Mons".to_owned(), Err(TimezoneProblem::Unknown)),
            ("/usr/share/zoneinfo/Mars/Base".to_owned(), Err(TimezoneProblem::Unknown)),
        ];
        for (text, expected) in cases {
            assert_eq!(Timezone::resolve(&text), expected, "{text}");
        }
    }
}
