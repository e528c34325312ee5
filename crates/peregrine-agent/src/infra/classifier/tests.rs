//! Unit tests of the classifier, driving `execute` directly with a fake LLM (reference §8.2
//! case 11 and the §2.3 behaviour in both modes).

use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::Utc;
use peregrine_core::state::{ErrorInfo, NodeKind};
use peregrine_core::{CapabilitySpec, ClassifierExample, ClassifierGuide, ContextEntry, GraphState, Requirement};
use peregrine_llm::{ChatRequest, ChatResponse, EventStream, FakeProvider, LlmErrorKind, LlmProvider, ProviderFeatures};

use super::*;
use crate::settings::AgentSettings;

const ADDRESSES: &str = "CHANNEL_ADDRESSES";

fn spec(name: &str, guided: bool, provides: &[&str], requires: &[&str]) -> CapabilitySpec {
    CapabilitySpec {
        provides: provides.iter().map(|provided| (*provided).to_owned()).collect(),
        requires: requires.iter().map(|required| Requirement::any(*required)).collect(),
        classifier_guide: guided.then(|| ClassifierGuide {
            instructions: format!("Select {name} when the task needs it."),
            examples: vec![
                ClassifierExample { query: format!("use {name} please"), result: true, reason: "asks for it".into() },
                ClassifierExample { query: "hello".into(), result: false, reason: "small talk".into() },
            ],
            actions_if_true: None,
        }),
        ..CapabilitySpec::new(name, format!("the {name} capability"))
    }
}

/// respond and clarify (always active; respond even has a guide, which must not be used), five
/// guided capabilities with a dependency chain channel_write/channel_read → channel_finding →
/// sector_lookup, and one capability without a guide.
fn catalog() -> Arc<Catalog> {
    let always = |mut spec: CapabilitySpec| {
        spec.always_active = true;
        spec
    };
    Arc::new(Catalog::new(vec![
        always(spec("respond", true, &["FINAL_RESPONSE"], &[])),
        always(spec("clarify", false, &[], &[])),
        spec("channel_finding", true, &[ADDRESSES], &["SECTOR_MAP"]),
        spec("sector_lookup", true, &["SECTOR_MAP"], &[]),
        spec("channel_read", true, &["CHANNEL_VALUES"], &[ADDRESSES]),
        spec("channel_write", true, &["WRITE_RESULTS"], &[ADDRESSES]),
        spec("python", true, &["PYTHON_RESULTS"], &[]),
        spec("legacy_tool", false, &[], &[]),
    ]))
}

const GUIDED_CANDIDATES: [&str; 5] = ["channel_finding", "sector_lookup", "channel_read", "channel_write", "python"];

fn state_with_task(task: &str) -> AgentState {
    let mut state = AgentState::default();
    state.task.current_task = Some(task.into());
    state
}

fn settings(mode: ClassifierMode) -> AgentSettings {
    AgentSettings { classifier_mode: mode, ..AgentSettings::default() }
}

fn system_prompt(request: &ChatRequest) -> &str {
    request.messages.first().map(|message| message.content.as_str()).unwrap_or_default()
}

/// Answers `CapabilityMatch` with true for the capabilities in `wanted` (recognised by their
/// guide's instructions in the prompt) and `CapabilitySelection` with `selected`.
fn deciding(wanted: &'static [&'static str], selected: &'static str) -> FakeProvider {
    FakeProvider::by_schema(move |schema, request| match schema {
        "CapabilityMatch" => {
            let is_match = wanted.iter().any(|name| system_prompt(request).contains(&format!("Select {name} when")));
            Ok(format!("{{\"is_match\": {is_match}}}"))
        }
        "CapabilitySelection" => Ok(selected.to_owned()),
        other => Err(FakeProvider::error(LlmErrorKind::BadRequest { status: 400 }, &format!("unexpected schema {other}"))),
    })
}

fn classifier(client: peregrine_llm::LlmClient, mode: ClassifierMode) -> Classifier {
    Classifier::new(Services::new(Arc::new(client), settings(mode)), catalog())
}

async fn run(node: &Classifier, state: &AgentState) -> (Result<CapabilityOutcome, CapabilityError>, Vec<AgentEvent>) {
    crate::test_support::run_node(node, state).await
}

fn update_of(result: Result<CapabilityOutcome, CapabilityError>) -> AgentStateUpdate {
    match result.expect("classification succeeds") {
        CapabilityOutcome::Done(update) => update,
        other => panic!("unexpected outcome {other:?}"),
    }
}

fn active(result: Result<CapabilityOutcome, CapabilityError>) -> Vec<String> {
    update_of(result).active_capabilities.expect("the update sets the active capabilities")
}

#[tokio::test]
async fn acceptance_case_11_one_call_per_guided_capability_and_never_for_always_active_ones() {
    let fake = deciding(&["respond", "clarify", "python", "legacy_tool"], "");
    let node = classifier(fake.client(), ClassifierMode::PerCapability);
    let (result, events) = run(&node, &state_with_task("Compute the mean of 1, 2 and 3")).await;
    assert_eq!(active(result), ["respond", "clarify", "python"]);
    let requests = fake.requests_for("CapabilityMatch");
    assert_eq!(requests.len(), GUIDED_CANDIDATES.len(), "one call per guided capability that is not always active");
    assert_eq!(fake.requests().len(), requests.len());
    for name in GUIDED_CANDIDATES {
        let asked = requests.iter().filter(|request| system_prompt(request).contains(&format!("Select {name} when"))).count();
        assert_eq!(asked, 1, "{name} is asked about exactly once");
    }
    assert!(!requests.iter().any(|request| system_prompt(request).contains("Select respond when")), "respond is never asked about");
    assert!(events.iter().any(|event| matches!(
        &event.kind,
        EventKind::CapabilitiesSelected { capability_names, all_capability_names }
            if capability_names == &["respond", "clarify", "python"] && all_capability_names.len() == 8
    )));
}

#[tokio::test]
async fn a_capability_without_a_guide_is_never_selected() {
    let fake = FakeProvider::by_schema(|_, _| Ok(r#"{"is_match": true}"#.to_owned()));
    let node = classifier(fake.client(), ClassifierMode::PerCapability);
    let selected = active(run(&node, &state_with_task("do everything")).await.0);
    assert!(!selected.iter().any(|name| name == "legacy_tool"));
    assert_eq!(selected.len(), 7, "every guided or always-active capability said yes");
}

#[tokio::test]
async fn only_always_active_capabilities_means_no_llm_call_at_all() {
    let fake = deciding(&[], "");
    let only_terminal =
        Catalog::new(catalog().specs().iter().filter(|spec| spec.always_active || spec.name == "legacy_tool").cloned().collect());
    let node = Classifier::new(Services::new(Arc::new(fake.client()), settings(ClassifierMode::PerCapability)), Arc::new(only_terminal));
    assert_eq!(active(run(&node, &state_with_task("hello")).await.0), ["respond", "clarify"]);
    assert!(fake.requests().is_empty());
}

/// Counts the calls in flight at once; every call yields a few times before answering, so
/// concurrent calls overlap.
struct Overlapping {
    inner: FakeProvider,
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl LlmProvider for Overlapping {
    fn name(&self) -> &str {
        "fake"
    }

    fn features(&self) -> ProviderFeatures {
        LlmProvider::features(&self.inner)
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, peregrine_llm::LlmError> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        let response = self.inner.complete(request).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        response
    }

    async fn stream(&self, request: ChatRequest) -> Result<EventStream, peregrine_llm::LlmError> {
        self.inner.stream(request).await
    }
}

#[tokio::test]
async fn per_capability_calls_respect_max_concurrent_classifications() {
    for limit in [1, 2, 5] {
        let fake = deciding(&["python"], "");
        let peak = Arc::new(AtomicUsize::new(0));
        let provider = Overlapping { inner: fake.clone(), in_flight: Arc::new(AtomicUsize::new(0)), peak: peak.clone() };
        let client = fake.client().with_provider("fake", provider);
        let mut settings = settings(ClassifierMode::PerCapability);
        settings.limits.max_concurrent_classifications = limit;
        let node = Classifier::new(Services::new(Arc::new(client), settings), catalog());
        assert_eq!(active(run(&node, &state_with_task("compute something")).await.0), ["respond", "clarify", "python"]);
        assert_eq!(fake.requests_for("CapabilityMatch").len(), 5);
        assert_eq!(peak.load(Ordering::SeqCst), limit, "the bound {limit} is reached and never exceeded");
    }
}

#[tokio::test]
async fn required_context_providers_are_added_transitively() {
    let fake = deciding(&["channel_write"], "");
    let node = classifier(fake.client(), ClassifierMode::PerCapability);
    let selected = active(run(&node, &state_with_task("Set SR:HCM1 to 1.5 A")).await.0);
    assert_eq!(selected, ["respond", "clarify", "channel_finding", "sector_lookup", "channel_write"]);
}

#[tokio::test]
async fn stored_context_makes_the_provider_unnecessary() {
    let fake = deciding(&["channel_write"], "");
    let node = classifier(fake.client(), ClassifierMode::PerCapability);
    let mut state = state_with_task("Set it to 1.5 A");
    state.capability_context_data.insert(ADDRESSES, "0_channel_finding", ContextEntry::new(serde_json::json!(["SR:HCM1"]), None));
    assert_eq!(active(run(&node, &state).await.0), ["respond", "clarify", "channel_write"]);
}

#[test]
fn expansion_table() {
    let catalog = catalog();
    let mut stored = ContextStore::default();
    stored.insert("SECTOR_MAP", "map", ContextEntry::new(serde_json::json!({}), None));
    let table: [(&[&str], &ContextStore, &[&str]); 4] = [
        (&["python"], &ContextStore::default(), &["python"]),
        (&["channel_read"], &ContextStore::default(), &["channel_finding", "sector_lookup", "channel_read"]),
        (&["channel_read"], &stored, &["channel_finding", "channel_read"]),
        (&["channel_finding", "channel_write"], &stored, &["channel_finding", "channel_write"]),
    ];
    for (start, context, expected) in table {
        let mut selected: HashSet<String> = start.iter().map(|name| (*name).to_owned()).collect();
        expand_dependencies(&catalog, context, &mut selected);
        let ordered: Vec<&str> = catalog.names().filter(|name| selected.contains(*name)).collect();
        assert_eq!(ordered, expected, "from {start:?}");
    }
}

#[tokio::test]
async fn caps_off_selects_everything_without_the_llm() {
    let fake = deciding(&[], "");
    let node = classifier(fake.client(), ClassifierMode::PerCapability);
    let mut state = state_with_task("anything");
    state.agent_control.capability_selection_bypass_enabled = true;
    let selected = active(run(&node, &state).await.0);
    assert_eq!(selected, catalog().names().collect::<Vec<_>>());
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn batched_mode_makes_one_call_with_a_narrowed_schema_and_ignores_unknown_names() {
    let fake = deciding(
        &[],
        r#"{"reasoning": "reads a channel", "selected": ["channel_read", "made_up", "respond", "legacy_tool", "channel_read"]}"#,
    );
    let node = classifier(fake.client(), ClassifierMode::Batched);
    let selected = active(run(&node, &state_with_task("Read the beam current")).await.0);
    assert_eq!(selected, ["respond", "clarify", "channel_finding", "sector_lookup", "channel_read"]);
    assert_eq!(fake.requests().len(), 1);
    let request = &fake.requests_for("CapabilitySelection")[0];
    let schema = &request.response_schema.as_ref().expect("the schema goes natively").schema;
    assert_eq!(schema["properties"]["selected"]["items"]["enum"], serde_json::json!(GUIDED_CANDIDATES));
    let prompt = system_prompt(request);
    for name in GUIDED_CANDIDATES {
        assert!(
            prompt
                .contains(&format!("### {name}\nSelect {name} when the task needs it.\nExamples:\n  - User Query: \"use {name} please\""))
        );
    }
    assert!(!prompt.contains("### respond") && !prompt.contains("### legacy_tool"));
    assert_eq!(request.messages[1].content, "User request:\nRead the beam current");
}

#[test]
fn selection_schema_keeps_the_type_name_and_narrows_only_the_names() {
    let schema = selection_schema(["a", "b"]);
    assert_eq!(schema.name, "CapabilitySelection");
    assert_eq!(schema.schema["properties"]["selected"]["items"], serde_json::json!({"type": "string", "enum": ["a", "b"]}));
    assert_eq!(schema.schema["properties"]["reasoning"]["type"], "string");
    assert_eq!(schema.schema["properties"]["selected"]["maxItems"], 2, "no more names than candidates");
    assert_eq!(schema.schema["properties"]["reasoning"]["maxLength"], super::MAX_REASONING_CHARS);
    assert_eq!(schema_for::<CapabilityMatch>().name, "CapabilityMatch");
}

fn reclassifying(task: &str, severity: ErrorSeverity) -> AgentState {
    let mut state = state_with_task(task);
    state.control.has_error = true;
    state.control.error_info = Some(ErrorInfo {
        node: "python".into(),
        node_kind: NodeKind::Capability,
        classification: ErrorClassification::new(severity, "the task needs live channel values, not computation"),
        retry_policy: RetryPolicy::capability_default(),
        original_error: "wrong capability".into(),
        execution_time_ms: 3,
        timestamp: Utc::now(),
    });
    state
}

#[tokio::test]
async fn reclassification_tells_the_model_what_failed_in_both_modes() {
    let expected = "Previous approach failed: Capability python requested reclassification: \
                    the task needs live channel values, not computation\n\nUser request:\nRead SR:DCCT";
    for mode in [ClassifierMode::PerCapability, ClassifierMode::Batched] {
        let fake = deciding(&["channel_read"], r#"{"reasoning": "r", "selected": ["channel_read"]}"#);
        let node = classifier(fake.client(), mode);
        let selected = active(run(&node, &reclassifying("Read SR:DCCT", ErrorSeverity::Reclassification)).await.0);
        assert!(selected.contains(&"channel_read".to_owned()));
        assert!(fake.requests().iter().all(|request| request.messages[1].content == expected), "{mode:?}");

        let fake = deciding(&[], r#"{"reasoning": "r", "selected": []}"#);
        let node = classifier(fake.client(), mode);
        run(&node, &reclassifying("Read SR:DCCT", ErrorSeverity::Retriable)).await.0.expect("succeeds");
        assert!(fake.requests().iter().all(|request| request.messages[1].content == "User request:\nRead SR:DCCT"), "{mode:?}");
    }
}

#[tokio::test]
async fn the_update_resets_the_plan_and_applies() {
    let fake = deciding(&["python"], "");
    let node = classifier(fake.client(), ClassifierMode::PerCapability);
    let mut state = state_with_task("compute");
    state.planning.current_step_index = 3;
    let update = update_of(run(&node, &state).await.0);
    assert_eq!(update.execution_plan, Slot::Set(None));
    assert_eq!(update.current_step_index, Some(0));
    state.apply(update);
    assert_eq!(state.planning.active_capabilities, ["respond", "clarify", "python"]);
    assert_eq!(state.planning.current_step_index, 0);
}

#[tokio::test]
async fn prompts_are_reproducible() {
    let first = deciding(&["python"], "");
    let second = deciding(&["python"], "");
    let state = state_with_task("compute");
    run(&classifier(first.client(), ClassifierMode::PerCapability), &state).await.0.expect("succeeds");
    run(&classifier(second.client(), ClassifierMode::PerCapability), &state).await.0.expect("succeeds");
    let prompts = |fake: &FakeProvider| fake.requests().into_iter().map(|request| request.messages).collect::<Vec<_>>();
    assert_eq!(prompts(&first), prompts(&second));
}

#[tokio::test]
async fn one_failed_call_only_deselects_that_capability() {
    let fake = FakeProvider::by_schema(|_, request| {
        if system_prompt(request).contains("Select channel_read when") {
            Err(FakeProvider::error(LlmErrorKind::Timeout, "slow"))
        } else {
            Ok(r#"{"is_match": true}"#.to_owned())
        }
    });
    let node = classifier(fake.client(), ClassifierMode::PerCapability);
    let selected = active(run(&node, &state_with_task("everything")).await.0);
    assert!(!selected.contains(&"channel_read".to_owned()));
    assert!(selected.contains(&"python".to_owned()) && selected.contains(&"channel_write".to_owned()));
}

#[tokio::test]
async fn when_every_call_fails_the_node_fails_with_the_right_severity() {
    let table = [
        (LlmErrorKind::Timeout, ErrorSeverity::Retriable),
        (LlmErrorKind::Server { status: 502 }, ErrorSeverity::Retriable),
        (LlmErrorKind::Auth { status: 401 }, ErrorSeverity::Critical),
    ];
    for mode in [ClassifierMode::PerCapability, ClassifierMode::Batched] {
        for (kind, severity) in table.clone() {
            let failing = kind.clone();
            let fake = FakeProvider::by_schema(move |_, _| Err(FakeProvider::error(failing.clone(), "scripted failure")));
            let node = classifier(fake.client(), mode);
            let (result, events) = run(&node, &state_with_task("Read SR:DCCT")).await;
            let error = result.expect_err("no silent empty selection");
            assert_eq!(node.classify_error(&error).severity, severity, "{mode:?} {kind:?}");
            assert!(events.iter().any(|event| matches!(event.kind, EventKind::PhaseComplete { success: false, .. })));
        }
    }
}

#[tokio::test]
async fn invalid_batched_output_is_retriable() {
    let fake = deciding(&[], "the answer is channel_read");
    let node = classifier(fake.client(), ClassifierMode::Batched);
    let error = run(&node, &state_with_task("Read SR:DCCT")).await.0.expect_err("unparseable answer");
    assert_eq!(node.classify_error(&error).severity, ErrorSeverity::Retriable);
    assert_eq!(fake.requests().len(), 2, "the problem is fed back once");
}

#[tokio::test]
async fn classifying_without_a_task_is_critical() {
    let fake = deciding(&[], "");
    let node = classifier(fake.client(), ClassifierMode::Batched);
    let error = run(&node, &AgentState::default()).await.0.expect_err("no task");
    assert_eq!(node.classify_error(&error).severity, ErrorSeverity::Critical);
    assert!(fake.requests().is_empty());
}

struct TerseFacilityPrompts;

impl ClassifierPrompts for TerseFacilityPrompts {
    fn role(&self) -> String {
        "You route requests in the ALS control room.".into()
    }

    fn format_examples(&self, _guide: &ClassifierGuide) -> String {
        String::new()
    }
}

#[tokio::test]
async fn an_application_overrides_single_prompt_parts() {
    let fake = deciding(&[], r#"{"reasoning": "r", "selected": []}"#);
    let node = classifier(fake.client(), ClassifierMode::Batched).with_prompts(Arc::new(TerseFacilityPrompts));
    run(&node, &state_with_task("hello")).await.0.expect("succeeds");
    let prompt = system_prompt(&fake.requests()[0]).to_owned();
    assert!(prompt.starts_with("You route requests in the ALS control room."));
    assert!(!prompt.contains("Examples:"));
    assert!(prompt.contains("### python\nSelect python when the task needs it."));
}

#[test]
fn node_identity_and_policy() {
    let node = classifier(deciding(&[], "").client(), ClassifierMode::Batched);
    assert_eq!(node.name(), "classifier");
    assert_eq!(node.retry_policy(), RetryPolicy::classifier());
    assert_eq!(node.classify_error(&CapabilityError::new("boom")).severity, ErrorSeverity::Critical);
}
