//! `peregrine serve`: the agent over HTTP — the OpenAI-compatible API (`/v1/models`,
//! `/v1/chat/completions`) for Open WebUI and any OpenAI client, the native threads/runs API
//! (`/threads`) and the web UI (`/`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::Context as _;
use peregrine_server::ServerOptions;

use crate::app::Application;
use crate::cli::Failure;
use crate::config::Config;
use crate::output::Output;
use crate::runtime;

/// How long a stopping server waits for running turns and open streams.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// `serve` options.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The address to bind (default `server.host`, else 127.0.0.1).
    #[arg(long)]
    pub host: Option<String>,
    /// The port (default `server.port`, else 8000; 0 picks a free one).
    #[arg(long, short = 'p')]
    pub port: Option<u16>,
}

/// Serves until Ctrl-C.
pub async fn run(args: &ServeArgs, config: &Config, app: &dyn Application, out: &Output) -> Result<(), Failure> {
    let host = args.host.clone().unwrap_or_else(|| config.server.host.clone());
    let port = args.port.unwrap_or(config.server.port);
    let ip: IpAddr = host
        .parse()
        .map_err(|_| Failure::usage(format!("'{host}' is not an IP address to bind; use e.g. 127.0.0.1 (server.host or --host)")))?;
    if !ip.is_loopback() && config.server.api_keys.is_empty() {
        return Err(Failure::usage(format!(
            "serving on {ip} would let anyone on the network use the agent: set server.api_keys in config.yml, or bind to 127.0.0.1"
        )));
    }
    let agent = runtime::agent(config, app).await.map_err(|error| Failure::usage(format!("{error:#}")))?;
    let options = ServerOptions {
        model_id: app.name().to_owned(),
        api_keys: config.server.api_keys.clone(),
        max_body_bytes: config.server.max_body_bytes,
        status_lines: config.server.status_lines,
        redact: Arc::new(config.redactor()),
        agent_data_dir: Some(config.settings.agent_data_dir.clone()),
    };
    let router = peregrine_server::router(Arc::new(agent), options);
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, port))
        .await
        .with_context(|| format!("cannot listen on {ip}:{port}"))
        .map_err(Failure::from)?;
    let address = listener.local_addr().context("the listening address").map_err(Failure::from)?;
    // The address on stdout (scripts and tests read it); everything else on stderr.
    println!("listening on http://{address}");
    out.note(&format!(
        "{}: web UI at http://{address}/, OpenAI-compatible API at http://{address}/v1 (model '{}'), threads API at http://{address}/threads; Ctrl-C stops",
        app.name(),
        app.name()
    ));
    let stopping = tokio_util::sync::CancellationToken::new();
    let on_signal = stopping.clone();
    tokio::spawn(async move {
        // Without a signal handler the server runs until killed.
        if tokio::signal::ctrl_c().await.is_ok() {
            on_signal.cancel();
        }
    });
    let server = axum::serve(listener, router).with_graceful_shutdown(stopping.clone().cancelled_owned());
    tokio::select! {
        served = server => served.context("the server stopped").map_err(Failure::from)?,
        () = async {
            stopping.cancelled().await;
            out.note(&format!("stopping: waiting up to {} s for running turns (Ctrl-C again stops at once)", SHUTDOWN_GRACE.as_secs()));
            tokio::select! {
                () = tokio::time::sleep(SHUTDOWN_GRACE) => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        } => {
            out.warn("stopped with turns still running; their threads keep their last checkpoint and can be continued");
        }
    }
    Ok(())
}
