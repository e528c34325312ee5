//! "Continue Response" on the OpenAI-compatible API: a history that ends with the assistant's
//! answer finishes the conversation's cut-off turn (stopped by a client that went away, by a
//! shutdown or by a crash) from its last checkpoint ([`peregrine_agent::Agent::continue_turn`]
//! decides whether there is one), and is refused with 409 `nothing_to_continue` when the
//! conversation has none.

use peregrine_agent::NothingToContinue;

use crate::error::ApiError;
use crate::progress::CUT_NOTE;
use crate::request::{Conversation, TurnInput};

/// The refusal of a continuation, in the words of a chat client's user.
pub(crate) fn nothing_to_continue(why: NothingToContinue) -> ApiError {
    let message = match why {
        NothingToContinue::NoThread => {
            "This conversation has no turn on this server yet (no thread was found for its history), so there is no answer to \
             continue; send a message instead."
        }
        NothingToContinue::ApprovalPending => {
            "The answer is complete: it asks for an approval, which is still pending. Reply 'yes' or 'no' to answer it."
        }
        NothingToContinue::Finished => {
            "The conversation's last turn finished, so there is no cut-off answer to continue (only a turn stopped before its \
             end, by the Stop button, a dropped connection or a server restart, can be continued); send a new message instead."
        }
    };
    ApiError::conflict("nothing_to_continue", message)
}

/// The content that opens the answer (see [`crate::progress::TurnTrace::opening`]). A new
/// message's answer opens with the conversation's mark and a blank line, when it has a mark. A
/// continued answer carries no mark (the client adds it to the answer it continues, which
/// already holds it, or was found without one); the turn's node that was cut off runs again
/// from its start, so when the answer being continued shows text, the note that an answer was
/// cut off separates it from the new one.
pub(crate) fn opening(conversation: &Conversation) -> Option<String> {
    match (&conversation.input, &conversation.mark) {
        (TurnInput::Continue { shown: true }, _) => Some(CUT_NOTE.to_owned()),
        (TurnInput::Continue { shown: false }, _) | (TurnInput::Message(_), None) => None,
        (TurnInput::Message(_), Some(mark)) => Some(format!("{mark}\n\n")),
    }
}

#[cfg(test)]
mod tests {
    use peregrine_agent::Session;

    use super::*;
    use crate::request::Identity;

    fn conversation(input: TurnInput, mark: Option<&str>) -> Conversation {
        Conversation {
            thread_id: "oai-t".into(),
            identity: Identity::Mark,
            mark: mark.map(str::to_owned),
            input,
            shown: None,
            session: Session::new("api", "openwebui"),
        }
    }

    #[test]
    fn a_new_message_opens_with_the_mark_and_a_continuation_with_the_cut_note_after_text() {
        let message = || TurnInput::Message("hi".into());
        assert_eq!(opening(&conversation(message(), Some("M"))).as_deref(), Some("M\n\n"));
        assert_eq!(opening(&conversation(message(), None)), None);
        for mark in [Some("M"), None] {
            assert_eq!(opening(&conversation(TurnInput::Continue { shown: true }, mark)).as_deref(), Some(CUT_NOTE), "{mark:?}");
            assert_eq!(opening(&conversation(TurnInput::Continue { shown: false }, mark)), None, "no second mark: {mark:?}");
        }
    }
}
