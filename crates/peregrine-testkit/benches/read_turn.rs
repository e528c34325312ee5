//! The framework's overhead of a control-system read turn: "what is the beam current?" through
//! the whole agent (gateway, task extraction, classifier, orchestrator, `channel_read`,
//! respond; SQLite checkpoints) with an instant in-process model, against the channel read on
//! its own through the same connector. The difference is what the framework adds to a read.
//! On the test IOC (`PEREGRINE_TEST_CA_SERVER`, from `scripts/epics-ioc.sh`) the connector is
//! EPICS; without it, the mock machine. Writes medians and spread to
//! `bench-results/read_turn.json` (or `PEREGRINE_BENCH_OUT`).
//!
//! ```text
//! cargo bench -p peregrine-testkit --bench read_turn
//! ```

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::print_stdout, reason = "a benchmark")]

use std::sync::Arc;
use std::time::Instant;

use peregrine_agent::{Agent, AgentSettings, ClassifierMode, Services, Session, TurnOptions, TurnStatus};
use peregrine_capabilities::ChannelReadCapability;
use peregrine_checkpoint::SqliteCheckpointer;
use peregrine_control::{MockControlSystem, MockSettings, SharedControlSystem};
use peregrine_core::Registry;
use peregrine_llm::FakeProvider;
use serde_json::json;

const TURNS: usize = 200;
const READS: usize = 2_000;

fn spread(mut samples: Vec<f64>) -> serde_json::Value {
    samples.sort_by(f64::total_cmp);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss, reason = "an index")]
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    json!({"median": at(0.5), "p10": at(0.1), "p90": at(0.9), "min": samples[0], "max": samples[samples.len() - 1], "samples": samples.len()})
}

#[tokio::main]
async fn main() {
    let (connector, channel, kind): (SharedControlSystem, &str, &str) = match std::env::var("PEREGRINE_TEST_CA_SERVER") {
        Ok(server) => {
            let settings = peregrine_control::epics::EpicsSettings {
                timeout: std::time::Duration::from_secs(2),
                addresses: vec![server],
                server_port: 5064,
            };
            (Arc::new(peregrine_control::epics::LazyEpicsControlSystem::new(settings)), "BENCH:VALUE", "epics")
        }
        Err(_) => (Arc::new(MockControlSystem::new(MockSettings::default())), "SR:DCCT:CURRENT", "mock"),
    };
    let plan = json!({"steps": [
        {"context_key": "reading", "capability": "channel_read", "task_objective": format!("Read {channel}"), "success_criteria": "read",
         "expected_output": "CHANNEL_VALUES", "inputs": []},
        {"context_key": "answer", "capability": "respond", "task_objective": "Tell the user", "success_criteria": "answered",
         "expected_output": "user_response", "inputs": [{"CHANNEL_VALUES": "reading"}]}]});
    let channel_owned = channel.to_owned();
    let fake = FakeProvider::by_schema(move |schema, _| {
        Ok(match schema {
            "ExtractedTask" => {
                json!({"task": format!("Read {channel_owned}"), "depends_on_chat_history": false, "depends_on_user_memory": false})
            }
            "CapabilitySelection" => json!({"reasoning": "bench", "selected": ["channel_read"]}),
            "ExecutionPlan" => plan.clone(),
            "ChannelAddressExtraction" => json!({"channels": [channel_owned]}),
            _ => return Ok("The value is 1.5.".to_owned()),
        }
        .to_string())
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let settings = AgentSettings { classifier_mode: ClassifierMode::Batched, ..AgentSettings::with_data_dir(dir.path().join("data")) };
    let services = Services::new(Arc::new(fake.client()), settings);
    let mut registry = Registry::new();
    registry.register(ChannelReadCapability::new(services.clone(), Arc::clone(&connector))).expect("channel_read");
    let store = SqliteCheckpointer::open(dir.path().join("bench.db")).await.expect("sqlite");
    let agent = Agent::builder(registry, services).checkpointer(Arc::new(store)).build().expect("agent");
    let session = Session::new("bench", "bench");

    // Warm-up: the connector's channel and the store's file.
    connector.read_boxed(channel).await.expect("the channel reads");
    let warm = agent.send("warm-up", "What is the value?", &session, TurnOptions::default()).await.expect("turn");
    assert_eq!(warm.status, TurnStatus::Completed, "{:?}", warm.response);

    let mut read_us = Vec::with_capacity(READS);
    for _ in 0..READS {
        let start = Instant::now();
        connector.read_boxed(channel).await.expect("read");
        read_us.push(start.elapsed().as_secs_f64() * 1e6);
    }
    let mut turn_us = Vec::with_capacity(TURNS);
    for turn in 0..TURNS {
        let start = Instant::now();
        let done = agent.send(&format!("t{turn}"), "What is the value?", &session, TurnOptions::default()).await.expect("turn");
        turn_us.push(start.elapsed().as_secs_f64() * 1e6);
        assert_eq!(done.status, TurnStatus::Completed);
    }
    let read = spread(read_us);
    let turn = spread(turn_us);
    let overhead = turn["median"].as_f64().unwrap_or(0.0) - read["median"].as_f64().unwrap_or(0.0);
    let report = json!({
        "benchmark": "read_turn",
        "connector": kind,
        "channel": channel,
        "model": "instant in-process fake (no model time)",
        "store": "sqlite (synchronous=FULL: every checkpoint is fsynced)",
        "llm_calls_per_turn": fake.requests().len() / (TURNS + 1),
        "read_alone_us": read,
        "read_turn_us": turn,
        "framework_overhead_median_us": overhead,
    });
    let out = std::env::var("PEREGRINE_BENCH_OUT").unwrap_or_else(|_| "bench-results/read_turn.json".into());
    if let Some(parent) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(parent).expect("output directory");
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report).expect("json")).expect("written");
    println!("{}", serde_json::to_string_pretty(&report).expect("json"));
}
