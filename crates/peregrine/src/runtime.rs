//! Builds the agent an application runs on from a [`Config`]: the LLM client, the checkpoint
//! store, the framework's and the application's capabilities.

use std::sync::Arc;

use anyhow::Context as _;
use peregrine_agent::{Agent, Services};
use peregrine_capabilities::{
    CHANNEL_READ_CAPABILITY, CHANNEL_WRITE_CAPABILITY, ChannelReadCapability, ChannelWriteCapability, MemoryCapability, MemoryStore,
    TimeRangeCapability, UserMemoryDataSource,
};
use peregrine_checkpoint::{MemoryCheckpointer, PostgresCheckpointer, SqliteCheckpointer};
use peregrine_control::epics::{EpicsSettings, LazyEpicsControlSystem};
use peregrine_control::{MockControlSystem, SharedControlSystem};
use peregrine_core::Registry;
use peregrine_graph::DynCheckpointer;
use peregrine_llm::LlmClient;

use crate::app::Application;
use crate::config::{CheckpointerConfig, Config, ControlSystemKind};

/// Opens the checkpoint store the configuration names (creating a SQLite file's directory).
pub async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn DynCheckpointer>> {
    Ok(match &config.checkpointer {
        CheckpointerConfig::Sqlite { path } => {
            if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).with_context(|| format!("cannot create the checkpoint directory {}", parent.display()))?;
            }
            let store =
                SqliteCheckpointer::open(path).await.with_context(|| format!("cannot open the checkpoint file {}", path.display()))?;
            Arc::new(store)
        }
        CheckpointerConfig::Postgres { url, pool_size } => {
            let store = match pool_size {
                Some(size) => PostgresCheckpointer::connect_with_pool_size(url.expose(), *size).await,
                None => PostgresCheckpointer::connect(url.expose()).await,
            };
            // The error may quote the URL; it never reaches the output unredacted.
            Arc::new(
                store.map_err(|error| anyhow::anyhow!("cannot open the PostgreSQL checkpointer: {}", config.redact(&error.to_string())))?,
            )
        }
        CheckpointerConfig::Memory => Arc::new(MemoryCheckpointer::new()),
    })
}

/// The LLM client of the configuration (recording calls when `development.api_calls.save_all`).
pub fn llm_client(config: &Config) -> anyhow::Result<Arc<LlmClient>> {
    check_local_model(config)?;
    let mut client = LlmClient::from_config(config.llm.clone()).map_err(|error| anyhow::anyhow!(config.redact(&error.to_string())))?;
    if config.development.save_api_calls {
        let dir = config.settings.agent_data_dir.join("api_calls");
        client = client.record_calls_to(&dir).map_err(|error| anyhow::anyhow!("cannot record LLM calls in {}: {error}", dir.display()))?;
    }
    Ok(Arc::new(client))
}

/// A local provider whose model file is missing fails with what to do, before anything loads.
fn check_local_model(config: &Config) -> anyhow::Result<()> {
    let used: std::collections::BTreeSet<&str> = config.llm.models.values().map(|model| model.provider.as_str()).collect();
    for name in used {
        let provider = config.llm.provider(name);
        let is_local = provider.protocol.as_deref().map_or(name == "local", |protocol| protocol == "local");
        let Some(path) = provider.model_path.as_deref().filter(|_| is_local) else { continue };
        if !std::path::Path::new(path).is_file() {
            let origin =
                if config.source.is_none() { "the embedded defaults use the local model" } else { "config.yml uses the local model" };
            anyhow::bail!(
                "{origin}, but there is no model file at {path}; fetch it with `bash scripts/fetch-model.sh` (or set PEREGRINE_LOCAL_MODEL \
                 to a GGUF file), or write a config.yml whose models name a provider"
            );
        }
    }
    Ok(())
}

/// The assembled agent of `app` on `config`.
pub async fn agent(config: &Config, app: &dyn Application) -> anyhow::Result<Agent> {
    let store = open_store(config).await?;
    agent_on(config, app, store)
}

/// The assembled agent of `app` on `config` with an already opened store.
pub fn agent_on(config: &Config, app: &dyn Application, store: Arc<dyn DynCheckpointer>) -> anyhow::Result<Agent> {
    let services = Services::new(llm_client(config)?, config.settings.clone());
    let mut registry = Registry::new();
    let mut builder_sources = register_builtins(config, app, &services, &mut registry)?;
    app.register(&mut registry, &services).with_context(|| format!("{} cannot register its capabilities", app.name()))?;
    builder_sources.extend(app.data_sources(&services));
    let mut prompts = app.prompts();
    if config.uses_embedded_model() && prompts.response.is_none() {
        // The embedded defaults answer with the small local model: a prompt it can follow.
        prompts.response = Some(Arc::new(crate::embedded::CompactResponsePrompts));
    }
    let mut builder = Agent::builder(registry, services).checkpointer(store).prompts(prompts);
    for source in builder_sources {
        builder = builder.data_source(source);
    }
    builder.build().context("the agent cannot be assembled")
}

/// The control-system connector `config` names.
pub fn control_system(config: &Config) -> anyhow::Result<SharedControlSystem> {
    match config.control_system.kind {
        ControlSystemKind::Mock => Ok(Arc::new(MockControlSystem::new(config.control_system.mock.clone()))),
        ControlSystemKind::Epics => Ok(Arc::new(LazyEpicsControlSystem::new(epics_settings(&config.control_system.epics)))),
    }
}

/// The Channel Access settings of `connector.epics`. `EPICS_CA_ADDR_LIST` in the environment
/// wins over `addr_list` (as every EPICS tool reads it); the gateways are searched with the
/// list (reads and writes go to whichever server has the channel; a read-only gateway refuses
/// writes).
fn epics_settings(epics: &crate::config::EpicsConfig) -> EpicsSettings {
    let from_environment = std::env::var("EPICS_CA_ADDR_LIST").is_ok_and(|list| !list.trim().is_empty());
    let mut addresses = if from_environment { Vec::new() } else { epics.addr_list.clone() };
    if !from_environment {
        addresses.extend(epics.read_gateway.iter().chain(&epics.write_gateway).cloned());
    }
    let server_port =
        epics.server_port.or_else(|| std::env::var("EPICS_CA_SERVER_PORT").ok().and_then(|port| port.trim().parse().ok())).unwrap_or(5064);
    EpicsSettings { timeout: epics.timeout, addresses, server_port }
}

/// Registers the framework's built-in capabilities the application and `capabilities.exclude`
/// allow; returns the data sources that come with them (user memory).
fn register_builtins(
    config: &Config,
    app: &dyn Application,
    services: &Services,
    registry: &mut Registry,
) -> anyhow::Result<Vec<Arc<dyn peregrine_agent::DataSource>>> {
    let mut sources: Vec<Arc<dyn peregrine_agent::DataSource>> = Vec::new();
    if !app.framework_capabilities() {
        return Ok(sources);
    }
    let included = &config.capabilities;
    if included.includes(peregrine_capabilities::MEMORY_CAPABILITY) {
        let memory = MemoryStore::new(&config.settings.agent_data_dir);
        registry.register(MemoryCapability::new(services.clone(), memory.clone())).context("registering memory")?;
        sources.push(Arc::new(UserMemoryDataSource::new(memory)));
    }
    if included.includes(peregrine_capabilities::TIME_RANGE_CAPABILITY) {
        registry.register(TimeRangeCapability::new(services.clone())).context("registering time_range_parsing")?;
    }
    let control = &config.control_system;
    let read = included.includes(CHANNEL_READ_CAPABILITY);
    let write = included.includes(CHANNEL_WRITE_CAPABILITY);
    if control.configured && (read || write) {
        let connector = control_system(config)?;
        if read {
            registry.register(ChannelReadCapability::new(services.clone(), Arc::clone(&connector))).context("registering channel_read")?;
        }
        if write {
            let capability = ChannelWriteCapability::new(services.clone(), connector, control.writes.clone());
            registry.register(capability).context("registering channel_write")?;
        }
    }
    Ok(sources)
}

/// The agent of `app` for reading threads only: no LLM provider is built (no model is loaded),
/// so listing and showing threads is instant; a turn on it would fail with a configuration error.
pub fn reader_agent(config: &Config, app: &dyn Application, store: Arc<dyn DynCheckpointer>) -> anyhow::Result<Agent> {
    let services = Services::new(Arc::new(LlmClient::new(peregrine_llm::LlmConfig::default())), config.settings.clone());
    let mut registry = Registry::new();
    register_builtins(config, app, &services, &mut registry)?;
    app.register(&mut registry, &services).with_context(|| format!("{} cannot register its capabilities", app.name()))?;
    Agent::builder(registry, services).checkpointer(store).build().context("the agent cannot be assembled")
}
