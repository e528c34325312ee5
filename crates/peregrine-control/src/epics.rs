//! The EPICS Channel Access connector (feature `epics`), on the pure-Rust `epics-ca-rs` client:
//! no EPICS C libraries at run time. Channels are created once and kept; each read is a
//! `DBR_TIME` get (value, timestamp, alarm) under the connector's timeout, metadata a `DBR_CTRL`
//! get plus the channel's access rights, cached per channel. A write checks the access rights
//! and an enum's states first (the IOC accepts an index past them), is sent with a put-callback
//! (WRITE_NOTIFY), and is read back when asked: an `ao` clamps a value above `DRVH` silently, so
//! only a readback shows it.
//!
//! Where the servers are: `EPICS_CA_ADDR_LIST`, `EPICS_CA_AUTO_ADDR_LIST`,
//! `EPICS_CA_SERVER_PORT` as every EPICS tool reads them, unless [`EpicsSettings::addresses`]
//! names them (the client's address list is then replaced at start).

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs as _};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use epics_base_rs::server::snapshot::{DbrClass, Snapshot};
use epics_ca_rs::client::{CaChannel, CaClient};
use epics_ca_rs::{CaError, EpicsValue, PvString};
use tokio::sync::mpsc;

use crate::connector::{ControlSystem, Monitor};
use crate::error::ControlError;
use crate::value::{AlarmSeverity, ChannelMetadata, ChannelValue, Reading, Verification, VerificationLevel};

/// How the connector reaches its servers.
#[derive(Debug, Clone, PartialEq)]
pub struct EpicsSettings {
    /// How long connecting, a read or a write's completion may take.
    pub timeout: Duration,
    /// `host[:port]` of the CA servers to search; empty: the `EPICS_CA_*` environment.
    pub addresses: Vec<String>,
    /// The port of an address without one (`EPICS_CA_SERVER_PORT`'s default is 5064).
    pub server_port: u16,
}

impl Default for EpicsSettings {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(5), addresses: Vec::new(), server_port: 5064 }
    }
}

#[derive(Clone)]
struct Known {
    channel: CaChannel,
    /// Whether it was ever connected: a channel never connected is unknown (or its IOC is
    /// unreachable — CA cannot tell them apart); one that was is disconnected.
    connected_once: bool,
}

/// The Channel Access connector.
pub struct EpicsControlSystem {
    client: CaClient,
    settings: EpicsSettings,
    channels: Mutex<HashMap<String, Known>>,
    metadata: Mutex<HashMap<String, ChannelMetadata>>,
}

impl std::fmt::Debug for EpicsControlSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpicsControlSystem").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// Names the EPICS client would expand or that are no channel name (`$VAR` is expanded from the
/// environment when `EPICS_CA_USE_SHELL_VARS` is set): refused before any search.
fn plain_name(address: &str) -> Result<(), ControlError> {
    let plain = !address.is_empty() && address.len() <= 256 && address.chars().all(|c| c.is_ascii_graphic() && c != '$');
    if plain { Ok(()) } else { Err(ControlError::UnknownChannel { address: address.to_owned() }) }
}

fn socket_addresses(settings: &EpicsSettings) -> Result<Vec<SocketAddr>, ControlError> {
    let mut resolved = Vec::new();
    for address in &settings.addresses {
        let with_port = if address.rsplit_once(':').is_some_and(|(_, port)| port.parse::<u16>().is_ok()) {
            address.clone()
        } else {
            format!("{address}:{}", settings.server_port)
        };
        let found = with_port.to_socket_addrs().map_err(|error| ControlError::Connector {
            detail: format!("the CA server address '{address}' cannot be resolved: {error}"),
        })?;
        resolved.extend(found);
    }
    Ok(resolved)
}

impl EpicsControlSystem {
    /// Starts the CA client (inside a tokio runtime).
    pub async fn connect(settings: EpicsSettings) -> Result<Self, ControlError> {
        let addresses = socket_addresses(&settings)?;
        let client =
            CaClient::new().await.map_err(|error| ControlError::Connector { detail: format!("the CA client cannot start: {error}") })?;
        if !addresses.is_empty() {
            client.set_address_list(addresses);
        }
        // The client's own reports go to the log, not to stderr.
        client.set_exception_handler(|exception| tracing::warn!(exception = %exception.message, pv = ?exception.pv_name, "channel access"));
        Ok(Self { client, settings, channels: Mutex::new(HashMap::new()), metadata: Mutex::new(HashMap::new()) })
    }

    /// The channel of `address`, connected.
    async fn channel(&self, address: &str) -> Result<CaChannel, ControlError> {
        plain_name(address)?;
        let known = {
            let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
            channels
                .entry(address.to_owned())
                .or_insert_with(|| Known { channel: self.client.create_channel(address), connected_once: false })
                .clone()
        };
        match known.channel.wait_connected(self.settings.timeout).await {
            Ok(()) => {
                if !known.connected_once {
                    let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some(entry) = channels.get_mut(address) {
                        entry.connected_once = true;
                    }
                }
                Ok(known.channel)
            }
            Err(_) if !known.connected_once => Err(ControlError::UnknownChannel { address: address.to_owned() }),
            Err(error) => Err(self.error(address, error)),
        }
    }

    /// A client error in the framework's terms.
    fn error(&self, address: &str, error: CaError) -> ControlError {
        let address = address.to_owned();
        match error {
            CaError::Timeout => ControlError::Timeout { address, seconds: self.settings.timeout.as_secs_f64() },
            CaError::Disconnected | CaError::Shutdown | CaError::ServerError(192) | CaError::ChannelNotFound(_) => {
                ControlError::Disconnected { address, detail: error.to_string() }
            }
            CaError::Protocol(message) if message.contains("write denied") => ControlError::AccessDenied { address, action: "write" },
            CaError::InvalidValue(detail) => ControlError::InvalidValue { address, value: String::new(), detail },
            other => ControlError::Connector { detail: format!("'{address}': {other}") },
        }
    }

    /// A get of `class` under the connector's timeout (the client's own is a fixed 30 s).
    async fn snapshot(&self, address: &str, channel: &CaChannel, class: DbrClass) -> Result<Snapshot, ControlError> {
        match tokio::time::timeout(self.settings.timeout, channel.get_with_metadata(class)).await {
            Ok(Ok(snapshot)) => Ok(snapshot),
            Ok(Err(error)) => Err(self.error(address, error)),
            Err(_) => Err(ControlError::Timeout { address: address.to_owned(), seconds: self.settings.timeout.as_secs_f64() }),
        }
    }

    fn reading(address: &str, snapshot: &Snapshot, metadata: Option<&ChannelMetadata>) -> Reading {
        let labels = metadata.map(|metadata| metadata.enum_strings.as_slice()).unwrap_or_default();
        let timestamp: DateTime<Utc> = SystemTime::from(snapshot.timestamp).into();
        Reading {
            address: address.to_owned(),
            value: channel_value(&snapshot.value, labels),
            units: metadata.and_then(|metadata| metadata.units.clone()),
            timestamp,
            severity: match snapshot.alarm.severity {
                0 => AlarmSeverity::NoAlarm,
                1 => AlarmSeverity::Minor,
                2 => AlarmSeverity::Major,
                _ => AlarmSeverity::Invalid,
            },
        }
    }

    async fn cached_metadata(&self, address: &str) -> Result<ChannelMetadata, ControlError> {
        if let Some(known) = self.metadata.lock().unwrap_or_else(PoisonError::into_inner).get(address) {
            return Ok(known.clone());
        }
        self.metadata(address).await
    }
}

/// A CA value as a channel value (an enum with its label when the states are known).
fn channel_value(value: &EpicsValue, labels: &[String]) -> ChannelValue {
    let ints = |items: Vec<i64>| ChannelValue::IntegerArray(items);
    match value {
        EpicsValue::Double(v) => ChannelValue::Double(*v),
        EpicsValue::Float(v) => ChannelValue::Double(f64::from(*v)),
        EpicsValue::Short(v) => ChannelValue::Integer(i64::from(*v)),
        EpicsValue::Long(v) => ChannelValue::Integer(i64::from(*v)),
        EpicsValue::Char(v) | EpicsValue::UChar(v) => ChannelValue::Integer(i64::from(*v)),
        EpicsValue::UShort(v) => ChannelValue::Integer(i64::from(*v)),
        EpicsValue::ULong(v) => ChannelValue::Integer(i64::from(*v)),
        EpicsValue::Int64(v) => ChannelValue::Integer(*v),
        EpicsValue::UInt64(v) => i64::try_from(*v).map_or_else(|_| ChannelValue::String(v.to_string()), ChannelValue::Integer),
        EpicsValue::Enum(index) | EpicsValue::EnumWithChoices { index, .. } => {
            ChannelValue::Enum { index: *index, label: labels.get(usize::from(*index)).cloned() }
        }
        EpicsValue::String(text) => ChannelValue::String(text.to_string()),
        EpicsValue::DoubleArray(items) => ChannelValue::DoubleArray(items.to_vec()),
        EpicsValue::FloatArray(items) => ChannelValue::DoubleArray(items.iter().map(|v| f64::from(*v)).collect()),
        EpicsValue::ShortArray(items) => ints(items.iter().map(|v| i64::from(*v)).collect()),
        EpicsValue::LongArray(items) => ints(items.iter().map(|v| i64::from(*v)).collect()),
        EpicsValue::CharArray(items) | EpicsValue::UCharArray(items) => ints(items.iter().map(|v| i64::from(*v)).collect()),
        EpicsValue::EnumArray(items) | EpicsValue::UShortArray(items) => ints(items.iter().map(|v| i64::from(*v)).collect()),
        EpicsValue::ULongArray(items) => ints(items.iter().map(|v| i64::from(*v)).collect()),
        EpicsValue::Int64Array(items) => ints(items.to_vec()),
        other => ChannelValue::String(other.to_string()),
    }
}

/// A channel value as a CA value for a channel of these states (checked: the IOC would take
/// an enum index past its states).
fn epics_value(address: &str, value: &ChannelValue, metadata: &ChannelMetadata) -> Result<EpicsValue, ControlError> {
    let invalid = |detail: String| ControlError::InvalidValue { address: address.to_owned(), value: value.display(), detail };
    let long = |v: i64| i32::try_from(v).map_err(|_| invalid("the value does not fit a CA long (32 bits)".into()));
    Ok(match value {
        ChannelValue::Double(v) => EpicsValue::Double(*v),
        ChannelValue::Integer(v) => EpicsValue::Long(long(*v)?),
        ChannelValue::String(text) => {
            if text.len() > 39 {
                return Err(invalid("a CA string holds at most 39 bytes".into()));
            }
            EpicsValue::String(PvString::from(text.as_str()))
        }
        ChannelValue::Enum { index, .. } => {
            if usize::from(*index) >= metadata.enum_strings.len() {
                return Err(invalid(format!("the channel's states are 0 to {}", metadata.enum_strings.len().saturating_sub(1))));
            }
            EpicsValue::Enum(*index)
        }
        ChannelValue::DoubleArray(items) => EpicsValue::DoubleArray(items.clone().into()),
        ChannelValue::IntegerArray(items) => EpicsValue::LongArray(items.iter().map(|v| long(*v)).collect::<Result<Vec<_>, _>>()?.into()),
    })
}

impl ControlSystem for EpicsControlSystem {
    fn name(&self) -> &str {
        "epics"
    }

    async fn read(&self, address: &str) -> Result<Reading, ControlError> {
        let channel = self.channel(address).await?;
        let metadata = self.cached_metadata(address).await.ok();
        let snapshot = self.snapshot(address, &channel, DbrClass::Time).await?;
        Ok(Self::reading(address, &snapshot, metadata.as_ref()))
    }

    async fn write(
        &self,
        address: &str,
        value: &ChannelValue,
        level: VerificationLevel,
        tolerance: f64,
    ) -> Result<Verification, ControlError> {
        let channel = self.channel(address).await?;
        let metadata = self.metadata(address).await?;
        if !metadata.writable {
            return Err(ControlError::AccessDenied { address: address.to_owned(), action: "write" });
        }
        let epics = epics_value(address, value, &metadata)?;
        channel.put_with_timeout(&epics, self.settings.timeout).await.map_err(|error| self.error(address, error))?;
        match level {
            VerificationLevel::None => Ok(Verification {
                level,
                verified: false,
                readback: None,
                tolerance: None,
                notes: "not verified (verification is off)".into(),
            }),
            VerificationLevel::Callback => Ok(Verification {
                level,
                verified: true,
                readback: None,
                tolerance: None,
                notes: "the IOC confirmed the put (put-callback)".into(),
            }),
            VerificationLevel::Readback => {
                let snapshot = self.snapshot(address, &channel, DbrClass::Time).await?;
                let read = Self::reading(address, &snapshot, Some(&metadata)).value;
                let verified = match (value.as_f64(), read.as_f64()) {
                    (Some(wanted), Some(got)) => (wanted - got).abs() <= tolerance,
                    _ => *value == read,
                };
                let notes = format!("read back {} (wrote {}, tolerance {tolerance})", read.display(), value.display());
                if verified {
                    Ok(Verification { level, verified, readback: Some(read), tolerance: Some(tolerance), notes })
                } else {
                    let hint = metadata
                        .control_limits
                        .map(|(low, high)| format!("; the channel's drive limits are {low} .. {high}"))
                        .unwrap_or_default();
                    Err(ControlError::VerificationFailed { address: address.to_owned(), notes: format!("{notes}{hint}") })
                }
            }
        }
    }

    async fn metadata(&self, address: &str) -> Result<ChannelMetadata, ControlError> {
        let channel = self.channel(address).await?;
        let snapshot = self.snapshot(address, &channel, DbrClass::Ctrl).await?;
        let access = tokio::time::timeout(self.settings.timeout, channel.info())
            .await
            .map_err(|_| ControlError::Timeout { address: address.to_owned(), seconds: self.settings.timeout.as_secs_f64() })?
            .map_err(|error| self.error(address, error))?
            .access_rights;
        let metadata = ChannelMetadata {
            address: address.to_owned(),
            units: snapshot.units().map(ToString::to_string).filter(|units| !units.is_empty()),
            precision: snapshot.precision().and_then(|precision| u16::try_from(precision).ok()),
            display_limits: snapshot.display_limits(),
            control_limits: snapshot.control_limits(),
            enum_strings: snapshot.enums.as_ref().map(|enums| enums.strings.iter().map(ToString::to_string).collect()).unwrap_or_default(),
            readable: access.read,
            writable: access.write,
        };
        self.metadata.lock().unwrap_or_else(PoisonError::into_inner).insert(address.to_owned(), metadata.clone());
        Ok(metadata)
    }

    async fn monitor(&self, address: &str) -> Result<Monitor, ControlError> {
        let channel = self.channel(address).await?;
        let metadata = self.cached_metadata(address).await.ok();
        let mut handle = channel.subscribe().await.map_err(|error| self.error(address, error))?;
        let (sender, readings) = mpsc::channel(256);
        let name = address.to_owned();
        let seconds = self.settings.timeout.as_secs_f64();
        tokio::spawn(async move {
            while let Some(event) = handle.recv().await {
                let reading = match event {
                    Ok(snapshot) => Ok(Self::reading(&name, &snapshot, metadata.as_ref())),
                    Err(CaError::Timeout) => Err(ControlError::Timeout { address: name.clone(), seconds }),
                    Err(error) => Err(ControlError::Disconnected { address: name.clone(), detail: error.to_string() }),
                };
                if sender.send(reading).await.is_err() {
                    break;
                }
            }
        });
        Ok(Monitor { address: address.to_owned(), readings })
    }
}

/// A shared handle, for callers that keep the connector in an `Arc`.
pub type SharedEpics = Arc<EpicsControlSystem>;

/// The Channel Access connector started on first use: an agent is assembled without waiting
/// for the network, and a client that cannot start fails the first read or write with the
/// reason (and is tried again on the next).
#[derive(Debug)]
pub struct LazyEpicsControlSystem {
    settings: EpicsSettings,
    client: tokio::sync::OnceCell<EpicsControlSystem>,
}

impl LazyEpicsControlSystem {
    /// The connector of `settings`, not started yet.
    pub fn new(settings: EpicsSettings) -> Self {
        Self { settings, client: tokio::sync::OnceCell::new() }
    }

    async fn client(&self) -> Result<&EpicsControlSystem, ControlError> {
        self.client.get_or_try_init(|| EpicsControlSystem::connect(self.settings.clone())).await
    }
}

impl ControlSystem for LazyEpicsControlSystem {
    fn name(&self) -> &str {
        "epics"
    }

    async fn read(&self, address: &str) -> Result<Reading, ControlError> {
        self.client().await?.read(address).await
    }

    async fn write(
        &self,
        address: &str,
        value: &ChannelValue,
        level: VerificationLevel,
        tolerance: f64,
    ) -> Result<Verification, ControlError> {
        self.client().await?.write(address, value, level, tolerance).await
    }

    async fn metadata(&self, address: &str) -> Result<ChannelMetadata, ControlError> {
        self.client().await?.metadata(address).await
    }

    async fn monitor(&self, address: &str) -> Result<Monitor, ControlError> {
        self.client().await?.monitor(address).await
    }
}
