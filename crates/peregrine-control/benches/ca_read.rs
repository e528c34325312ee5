//! Channel Access read speed: the connector against the IOC's own `caget`, on the test IOC of
//! `scripts/epics-ioc.sh` (`PEREGRINE_TEST_CA_SERVER`, `EPICS_BIN`). Writes medians and spread
//! to `bench-results/ca_read.json` (or `PEREGRINE_BENCH_OUT`).
//!
//! ```text
//! eval "$(bash scripts/epics-ioc.sh start /tmp/ioc)"
//! cargo bench -p peregrine-control --features epics --bench ca_read
//! ```

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::print_stdout, reason = "a benchmark")]

use std::time::{Duration, Instant};

use peregrine_control::ControlSystem;
use peregrine_control::epics::{EpicsControlSystem, EpicsSettings};

const CHANNEL: &str = "BENCH:VALUE";
const ROUNDS: usize = 5;
const SEQUENTIAL_READS: usize = 500;
const CONCURRENT_READS: usize = 2_000;
const CONCURRENCY: usize = 16;
const CAGET_RUNS: usize = 20;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss, reason = "an index")]
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index]
}

fn summary(mut samples: Vec<f64>) -> serde_json::Value {
    samples.sort_by(f64::total_cmp);
    serde_json::json!({
        "median": percentile(&samples, 0.5), "p10": percentile(&samples, 0.1), "p90": percentile(&samples, 0.9),
        "min": samples[0], "max": samples[samples.len() - 1], "samples": samples.len(),
    })
}

#[tokio::main]
async fn main() {
    let (Ok(server), Ok(bin)) = (std::env::var("PEREGRINE_TEST_CA_SERVER"), std::env::var("EPICS_BIN")) else {
        println!("ca_read: set PEREGRINE_TEST_CA_SERVER and EPICS_BIN (eval \"$(bash scripts/epics-ioc.sh start DIR)\")");
        return;
    };
    let settings = EpicsSettings { timeout: Duration::from_secs(2), addresses: vec![server.clone()], server_port: 5064 };
    let ca = EpicsControlSystem::connect(settings).await.expect("CA client");
    ca.read(CHANNEL).await.expect("the channel is served");

    let mut latencies_us = Vec::with_capacity(ROUNDS * SEQUENTIAL_READS);
    let mut rates = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        for _ in 0..SEQUENTIAL_READS {
            let start = Instant::now();
            ca.read(CHANNEL).await.expect("read");
            latencies_us.push(start.elapsed().as_secs_f64() * 1e6);
        }
        let addresses: Vec<String> = vec![CHANNEL.to_owned(); CONCURRENCY];
        let start = Instant::now();
        for _ in 0..CONCURRENT_READS / CONCURRENCY {
            for reading in ca.read_many(&addresses).await {
                reading.expect("read");
            }
        }
        #[allow(clippy::cast_precision_loss, reason = "a count")]
        rates.push(CONCURRENT_READS as f64 / start.elapsed().as_secs_f64());
    }

    let (host, port) = server.rsplit_once(':').expect("host:port");
    let mut caget_ms = Vec::with_capacity(CAGET_RUNS);
    for _ in 0..CAGET_RUNS {
        let start = Instant::now();
        let status = std::process::Command::new(std::path::Path::new(&bin).join("caget"))
            .arg(CHANNEL)
            .env("EPICS_CA_ADDR_LIST", host)
            .env("EPICS_CA_AUTO_ADDR_LIST", "NO")
            .env("EPICS_CA_SERVER_PORT", port)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("caget runs");
        assert!(status.success(), "caget failed");
        caget_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }

    let connector = summary(latencies_us);
    let caget = summary(caget_ms);
    let ratio = caget["median"].as_f64().unwrap_or(0.0) * 1e3 / connector["median"].as_f64().unwrap_or(1.0);
    let report = serde_json::json!({
        "benchmark": "ca_read",
        "channel": CHANNEL,
        "connector_read_latency_us": connector,
        "connector_reads_per_second": summary(rates),
        "concurrency": CONCURRENCY,
        "caget_process_ms": caget,
        "caget_over_connector_median_ratio": ratio,
        "note": "caget is a whole process per read (start, search, connect, read); the connector keeps its channel connected",
    });
    let out = std::env::var("PEREGRINE_BENCH_OUT").unwrap_or_else(|_| "bench-results/ca_read.json".into());
    if let Some(parent) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(parent).expect("output directory");
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report).expect("json")).expect("written");
    println!("{}", serde_json::to_string_pretty(&report).expect("json"));
}
