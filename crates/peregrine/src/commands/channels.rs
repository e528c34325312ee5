//! `channels get|put|monitor|info`: the control system through the same connector and the same
//! write gates as the agent, without an LLM — so a facility can check its `control_system`
//! configuration (and an operator can read or set a channel) from the shell. A `put` passes
//! `writes_enabled`, then the limits database, then a confirmation at the terminal (or
//! `--yes`), then it is written and verified; a stop at any gate is reported, never retried.

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use anyhow::{Context as _, bail};
use peregrine_control::{ChannelValue, DynControlSystem, Reading, WriteGate, WriteOutcome};
use serde_json::json;

use crate::config::Config;
use crate::output::Output;
use crate::turn::println_out;

/// `channels` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ChannelsCommand {
    /// Read channels: value, units, timestamp and alarm severity.
    Get {
        /// The channels (EPICS: PV names).
        #[arg(required = true)]
        addresses: Vec<String>,
        /// One JSON object per channel.
        #[arg(long)]
        json: bool,
    },
    /// Write a channel through the gates: writes_enabled, the limits database, your confirmation
    /// (or --yes); then the write is verified.
    Put {
        /// The channel.
        address: String,
        /// The value, in the channel's type (a number, an enum label or index, a string).
        value: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// The outcome as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Print a channel's value each time it changes.
    Monitor {
        /// The channel.
        address: String,
        /// Stop after this many readings (default: until Ctrl-C).
        #[arg(long)]
        count: Option<usize>,
    },
    /// A channel's metadata: units, precision, limits, enum strings, access.
    Info {
        /// The channel.
        address: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the subcommand.
pub async fn run(command: &ChannelsCommand, config: &Config, _out: &Output) -> anyhow::Result<()> {
    let connector = crate::runtime::control_system(config)?;
    let connector = connector.as_ref();
    match command {
        ChannelsCommand::Get { addresses, json } => get(connector, addresses, *json).await,
        ChannelsCommand::Put { address, value, yes, json } => put(connector, config, address, value, *yes, *json).await,
        ChannelsCommand::Monitor { address, count } => monitor(connector, address, *count).await,
        ChannelsCommand::Info { address, json } => info(connector, address, *json).await,
    }
}

fn reading_line(reading: &Reading) -> String {
    let units = reading.units.as_deref().map(|units| format!(" {units}")).unwrap_or_default();
    let severity = serde_json::to_value(reading.severity).ok().and_then(|value| value.as_str().map(str::to_owned)).unwrap_or_default();
    format!(
        "{} = {}{units}  ({}, {severity})",
        reading.address,
        reading.value.display(),
        reading.timestamp.format("%Y-%m-%d %H:%M:%S%.3f UTC")
    )
}

async fn get(connector: &dyn DynControlSystem, addresses: &[String], as_json: bool) -> anyhow::Result<()> {
    let mut failed = 0;
    for (address, result) in addresses.iter().zip(connector.read_many_boxed(addresses).await) {
        match result {
            Ok(reading) if as_json => drop(println_out(&serde_json::to_string(&reading)?)),
            Ok(reading) => drop(println_out(&reading_line(&reading))),
            Err(error) => {
                failed += 1;
                if as_json {
                    println_out(&json!({"address": address, "error": error.to_string()}).to_string());
                } else {
                    eprintln!("{address}: {error}");
                }
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} channels could not be read", addresses.len());
    }
    Ok(())
}

/// The text of a value in the type of the channel's current value.
/// Asks at the terminal; anything but y/yes declines.
fn confirmed(question: &str) -> anyhow::Result<bool> {
    eprint!("{question} [y/N] ");
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer).context("cannot read the confirmation")?;
    Ok(matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"))
}

async fn put(connector: &dyn DynControlSystem, config: &Config, address: &str, text: &str, yes: bool, as_json: bool) -> anyhow::Result<()> {
    let gate = WriteGate::new(&config.control_system.writes, connector);
    // The master switch and the address's limits come first, before anything is read or parsed.
    gate.precheck(address, None)?;
    // The value is read in the channel's type (the gates read the current value again).
    let current = connector.read_boxed(address).await?;
    let metadata = connector.metadata_boxed(address).await?;
    let value = ChannelValue::parse_as(text, &current.value, &metadata.enum_strings, address)?;
    let planned = gate.plan(&[(address.to_owned(), value)]).await?;
    let Some(write) = planned.first() else { bail!("nothing to write") };
    let units = current.units.as_deref().map(|units| format!(" {units}")).unwrap_or_default();
    let limits = write
        .limits
        .as_ref()
        .map(|limits| {
            let bound = |value: Option<f64>| value.map_or("-".to_owned(), |value| value.to_string());
            format!(" (limits: min {}, max {}, max step {})", bound(limits.min_value), bound(limits.max_value), bound(limits.max_step))
        })
        .unwrap_or_default();
    let question = format!("write {address}: {}{units} → {}{units}{limits}?", write.current.value.display(), write.value.display());
    if !yes {
        if !std::io::stdin().is_terminal() {
            bail!("{question} needs your confirmation: run it at a terminal, or pass --yes");
        }
        if !confirmed(&question)? {
            bail!("not written: the write was not confirmed");
        }
    }
    let WriteOutcome { previous, verification, .. } = gate.execute(write).await?;
    if as_json {
        println_out(&json!({"address": address, "previous": previous, "written": write.value, "verification": verification}).to_string());
    } else {
        println_out(&format!("{address}: {} → {}{units} ({})", previous.display(), write.value.display(), verification.notes));
    }
    Ok(())
}

async fn monitor(connector: &dyn DynControlSystem, address: &str, count: Option<usize>) -> anyhow::Result<()> {
    let mut monitor = connector.monitor_boxed(address).await?;
    let mut seen = 0;
    while count.is_none_or(|count| seen < count) {
        let next = tokio::select! {
            next = monitor.readings.recv() => next,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let Some(reading) = next else { bail!("the monitor of {address} ended: the connection is gone") };
        if !println_out(&reading_line(&reading?)) {
            return Ok(());
        }
        seen += 1;
    }
    Ok(())
}

async fn info(connector: &dyn DynControlSystem, address: &str, as_json: bool) -> anyhow::Result<()> {
    let metadata = connector.metadata_boxed(address).await?;
    if as_json {
        println_out(&serde_json::to_string_pretty(&metadata)?);
        return Ok(());
    }
    let range = |range: Option<(f64, f64)>| range.map_or("-".to_owned(), |(low, high)| format!("{low} .. {high}"));
    let lines = [
        format!("channel:        {}", metadata.address),
        format!("units:          {}", metadata.units.as_deref().unwrap_or("-")),
        format!("precision:      {}", metadata.precision.map_or("-".to_owned(), |precision| precision.to_string())),
        format!("display limits: {}", range(metadata.display_limits)),
        format!("control limits: {}", range(metadata.control_limits)),
        format!("enum states:    {}", if metadata.enum_strings.is_empty() { "-".to_owned() } else { metadata.enum_strings.join(", ") }),
        format!(
            "access:         {}{}",
            if metadata.readable { "read" } else { "no read" },
            if metadata.writable { ", write" } else { ", no write" }
        ),
    ];
    println_out(&lines.join("\n"));
    Ok(())
}
