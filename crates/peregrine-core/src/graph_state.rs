//! The contract between a state type and the durable graph engine: nodes return updates, the
//! engine applies them, and the same updates replayed in order rebuild the same state.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A state the graph engine can run, checkpoint and rebuild.
///
/// `apply` must be deterministic: the checkpointer stores updates (deltas) and rebuilds a state
/// from a snapshot plus the updates after it, so anything time- or randomness-dependent belongs
/// in the update, never in `apply`.
pub trait GraphState: Clone + Default + Serialize + DeserializeOwned + Send + Sync + 'static {
    /// What a node returns; stored as the checkpoint's delta.
    type Update: Clone + Default + Serialize + DeserializeOwned + Send + Sync + 'static;
    /// Domain events nodes emit on the run's event stream.
    type Event: Clone + Serialize + Send + Sync + 'static;

    /// Applies an update with the state's reducers.
    fn apply(&mut self, update: Self::Update);
}

/// A field patch in an update: leave the value alone, or set it (to `None` too, for optional
/// fields). Serialized as the value itself; absent means keep.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Slot<T> {
    /// Leave the field as it is.
    #[default]
    Keep,
    /// Replace the field.
    Set(T),
}

impl<T> Slot<T> {
    /// Whether this patch leaves the field alone (used by serde to skip it).
    pub fn is_keep(&self) -> bool {
        matches!(self, Self::Keep)
    }

    /// Writes the patch into `target`.
    pub fn apply_to(self, target: &mut T) {
        if let Self::Set(value) = self {
            *target = value;
        }
    }

    /// The later of two patches: `later` wins when it sets something.
    pub fn or_earlier(self, earlier: Self) -> Self {
        match self {
            Self::Set(value) => Self::Set(value),
            Self::Keep => earlier,
        }
    }
}

impl<T: Serialize> Serialize for Slot<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Set(value) => value.serialize(serializer),
            Self::Keep => serializer.serialize_unit(),
        }
    }
}

impl<'de, T: DeserializeOwned> serde::Deserialize<'de> for Slot<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Self::Set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, Serialize, serde::Deserialize)]
    struct Patch {
        #[serde(default, skip_serializing_if = "Slot::is_keep")]
        name: Slot<Option<String>>,
    }

    #[test]
    fn slot_distinguishes_keep_set_and_clear() {
        let cases = [
            (Patch { name: Slot::Keep }, "{}"),
            (Patch { name: Slot::Set(None) }, r#"{"name":null}"#),
            (Patch { name: Slot::Set(Some("a".into())) }, r#"{"name":"a"}"#),
        ];
        for (patch, json) in cases {
            assert_eq!(serde_json::to_string(&patch).expect("serializes"), json);
            assert_eq!(serde_json::from_str::<Patch>(json).expect("parses"), patch);
        }
    }

    #[test]
    fn later_slot_wins() {
        assert_eq!(Slot::Set(2).or_earlier(Slot::Set(1)), Slot::Set(2));
        assert_eq!(Slot::Keep.or_earlier(Slot::Set(1)), Slot::Set(1));
        let mut value = 5;
        Slot::Keep.apply_to(&mut value);
        assert_eq!(value, 5);
        Slot::Set(7).apply_to(&mut value);
        assert_eq!(value, 7);
    }
}
