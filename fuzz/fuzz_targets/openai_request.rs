//! A `POST /v1/chat/completions` body as any bytes, through the steps a request takes before its
//! turn starts (parse, model, supported options, background task, conversation identity from a
//! fixed caller with no headers, message limit, the answer's opening), and the reader of the
//! marks an answer carries.

#![no_main]

use libfuzzer_sys::fuzz_target;
use peregrine_server::fuzzing::{self, ChatOutcome};

fn is_thread_id(id: &str) -> bool {
    let owner = fuzzing::owner_tag();
    let Some(rest) = id.strip_prefix("oai-").and_then(|rest| rest.strip_prefix(owner.as_str())) else { return false };
    rest.strip_prefix('-').is_some_and(|hex| hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit()))
}

fuzz_target!(|body: &[u8]| {
    match fuzzing::chat_completion(body) {
        ChatOutcome::Refused(error) => assert!(error.status.is_client_error(), "{error:?}"),
        ChatOutcome::BackgroundTask { name, .. } => assert!(!name.is_empty()),
        ChatOutcome::Turn(turn) => {
            assert!(is_thread_id(&turn.thread_id), "{}", turn.thread_id);
            assert!(!turn.is_new || turn.mark.is_some(), "a new conversation's answer carries a mark");
            if let Some(mark) = &turn.mark {
                assert!(fuzzing::read_mark(mark).is_some(), "{mark:?}");
            }
            match fuzzing::chat_completion(body) {
                ChatOutcome::Turn(again) => {
                    assert_eq!((&again.message, &again.user_id), (&turn.message, &turn.user_id));
                    assert_eq!(again.thread_id == turn.thread_id, !turn.is_new, "only a new conversation gets a new thread");
                }
                other => panic!("the same body is answered differently: {other:?}"),
            }
        }
    }
    // The mark reader on the body as text: the first whole mark wins, and one appended after
    // text without a whole mark is read back.
    let text = String::from_utf8_lossy(body);
    let nonce = u64::from_le_bytes(std::array::from_fn(|index| body.get(index).copied().unwrap_or_default()));
    let marked = format!("{text}{}", fuzzing::mark(nonce));
    assert_eq!(fuzzing::read_mark(&marked), Some(fuzzing::read_mark(&text).unwrap_or(nonce)));
});
