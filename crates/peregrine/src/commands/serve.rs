//! `peregrine serve`: the agent over HTTP — the OpenAI-compatible API (`/v1/models`,
//! `/v1/chat/completions`) for Open WebUI and any OpenAI client, the native threads/runs API
//! (`/threads`) and the web UI (`/`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use peregrine_server::ServerOptions;

use crate::app::Application;
use crate::cli::Failure;
use crate::config::Config;
use crate::output::Output;
use crate::runtime;

/// How long a stopping server waits for running turns and open streams.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

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
    raise_open_files_limit(out);
    let agent = runtime::agent(config, app).await.map_err(|error| Failure::usage(format!("{error:#}")))?;
    let options = ServerOptions {
        model_id: app.name().to_owned(),
        api_keys: config.server.api_keys.clone(),
        max_body_bytes: config.server.max_body_bytes,
        body_timeout: config.server.body_timeout,
        max_message_bytes: config.server.max_message_bytes,
        max_turns_in_flight: config.server.max_turns_in_flight,
        allowed_origins: config.server.allowed_origins.clone(),
        status_lines: config.server.status_lines,
        redact: Arc::new(config.redactor()),
    };
    let server = peregrine_server::Server::new(Arc::new(agent), options);
    let router = server.router();
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
    // On Ctrl-C: no new connections; running turns get SHUTDOWN_GRACE to end, then they are
    // cancelled (each keeps its last checkpoint) and their streams end; a second Ctrl-C exits.
    let limits = peregrine_server::ConnectionLimits {
        header_timeout: config.server.header_timeout,
        max_connections: config.server.max_connections,
        ..peregrine_server::ConnectionLimits::default()
    };
    let http = tokio::spawn(peregrine_server::serve(listener, router, limits, stopping.clone()));
    stopping.cancelled().await;
    if server.running() > 0 {
        out.note(&format!(
            "stopping: waiting up to {} s for {} running turn(s) (Ctrl-C again stops at once)",
            SHUTDOWN_GRACE.as_secs(),
            server.running()
        ));
    }
    tokio::select! {
        cut_off = server.shut_down(SHUTDOWN_GRACE) => {
            if cut_off > 0 {
                out.warn(&format!(
                    "cancelled {cut_off} running turn(s); their threads keep their last checkpoint and can be continued"
                ));
            }
        }
        _ = tokio::signal::ctrl_c() => {
            out.warn("stopped at once; running turns keep their last checkpoint and can be continued");
            return Ok(());
        }
    }
    // Open streams end with their runs; connections still open after that are not waited for long.
    if let Ok(Err(error)) = tokio::time::timeout(Duration::from_secs(2), http).await {
        return Err(Failure::from(anyhow::anyhow!("the server task failed: {error}")));
    }
    Ok(())
}

/// The open-files limit below which a note says how many conversations it allows.
const LOW_OPEN_FILES: u64 = 4096;

/// Raises the soft open-files limit to the hard one: every conversation in flight holds a client
/// connection and a provider connection, and at the usual soft limit of 1,024 a busy server
/// stops accepting connections ("Too many open files").
fn raise_open_files_limit(out: &Output) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return };
    let raised = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() { hard } else { soft };
    if raised != soft {
        tracing::debug!(from = soft, to = raised, "raised the open-files limit");
    }
    if raised < LOW_OPEN_FILES {
        out.warn(&format!(
            "the open-files limit is {raised}: about {} conversations can run at once; raise it (ulimit -Hn) for more",
            raised / 2
        ));
    }
}
