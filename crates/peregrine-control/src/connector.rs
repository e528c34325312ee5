//! The connector trait every control-system backend implements, and its type-erased handle.
//! Connectors move values; they enforce no policy — the gates in [`crate::gate`] decide
//! whether a write may happen before a connector is asked.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::mpsc;

use crate::error::ControlError;
use crate::value::{ChannelMetadata, ChannelValue, Reading, Verification, VerificationLevel};

/// A stream of readings of one channel: the current one first, then one per change. Dropping
/// it ends the subscription.
#[derive(Debug)]
pub struct Monitor {
    /// The channel.
    pub address: String,
    /// The readings; closed when the connection is lost for good or the connector stops.
    pub readings: mpsc::Receiver<Result<Reading, ControlError>>,
}

/// A control-system backend (mock, EPICS Channel Access, …).
pub trait ControlSystem: Send + Sync + 'static {
    /// The backend's name (`mock`, `epics`).
    fn name(&self) -> &str;

    /// Reads one channel.
    fn read(&self, address: &str) -> impl Future<Output = Result<Reading, ControlError>> + Send;

    /// Reads several channels; each answer in the order asked, failures per channel.
    fn read_many(&self, addresses: &[String]) -> impl Future<Output = Vec<Result<Reading, ControlError>>> + Send {
        async move { futures::future::join_all(addresses.iter().map(|address| self.read(address))).await }
    }

    /// Writes `value` and checks it at `level` (`tolerance`: the largest difference a
    /// readback may show, in the channel's units). A write that was sent but not verified is
    /// [`ControlError::VerificationFailed`].
    fn write(
        &self,
        address: &str,
        value: &ChannelValue,
        level: VerificationLevel,
        tolerance: f64,
    ) -> impl Future<Output = Result<Verification, ControlError>> + Send;

    /// The channel's metadata (units, limits, precision, enum strings, access).
    fn metadata(&self, address: &str) -> impl Future<Output = Result<ChannelMetadata, ControlError>> + Send;

    /// Subscribes to the channel's changes.
    fn monitor(&self, address: &str) -> impl Future<Output = Result<Monitor, ControlError>> + Send;
}

/// The object-safe form of [`ControlSystem`], implemented for every connector.
pub trait DynControlSystem: Send + Sync + 'static {
    /// See [`ControlSystem::name`].
    fn name(&self) -> &str;
    /// See [`ControlSystem::read`].
    fn read_boxed<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<Reading, ControlError>>;
    /// See [`ControlSystem::read_many`].
    fn read_many_boxed<'a>(&'a self, addresses: &'a [String]) -> BoxFuture<'a, Vec<Result<Reading, ControlError>>>;
    /// See [`ControlSystem::write`].
    fn write_boxed<'a>(
        &'a self,
        address: &'a str,
        value: &'a ChannelValue,
        level: VerificationLevel,
        tolerance: f64,
    ) -> BoxFuture<'a, Result<Verification, ControlError>>;
    /// See [`ControlSystem::metadata`].
    fn metadata_boxed<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<ChannelMetadata, ControlError>>;
    /// See [`ControlSystem::monitor`].
    fn monitor_boxed<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<Monitor, ControlError>>;
}

impl<C: ControlSystem> DynControlSystem for C {
    fn name(&self) -> &str {
        ControlSystem::name(self)
    }

    fn read_boxed<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<Reading, ControlError>> {
        Box::pin(self.read(address))
    }

    fn read_many_boxed<'a>(&'a self, addresses: &'a [String]) -> BoxFuture<'a, Vec<Result<Reading, ControlError>>> {
        Box::pin(self.read_many(addresses))
    }

    fn write_boxed<'a>(
        &'a self,
        address: &'a str,
        value: &'a ChannelValue,
        level: VerificationLevel,
        tolerance: f64,
    ) -> BoxFuture<'a, Result<Verification, ControlError>> {
        Box::pin(self.write(address, value, level, tolerance))
    }

    fn metadata_boxed<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<ChannelMetadata, ControlError>> {
        Box::pin(self.metadata(address))
    }

    fn monitor_boxed<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<Monitor, ControlError>> {
        Box::pin(self.monitor(address))
    }
}

/// A shared connector.
pub type SharedControlSystem = Arc<dyn DynControlSystem>;
