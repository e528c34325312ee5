//! `<<` merge keys (`<<: *defaults`, PyYAML merges them, hence upstream does) without losing
//! how a scalar was written.
//!
//! serde_norway's deserializer does not merge, and its `Value::apply_merge` works on values that
//! have lost their text: `model_id: 3.10` becomes the number 3.1, and a text field would get
//! `3.1`. So a file whose parsed document holds a `<<` key is read twice: once as a `Value` (the
//! structure), then again from the text, guided by that structure, asking for every scalar as
//! text — serde_norway then hands over the scalar exactly as written. The resulting [`Node`]
//! tree keeps both the text and the YAML type, is merged as `apply_merge` would, and is itself
//! a deserializer: a text field gets the text (`3.10`, an all-digit key), a number field the
//! number. A line starting with `<<` inside a block scalar is text, not a merge key: detection
//! looks at the parsed document, never at lines.

use serde::de::value::{MapDeserializer, SeqDeserializer, StringDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde_norway::{Mapping, Value};

type Error = serde_norway::Error;

/// A YAML node that keeps each scalar's text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    /// `~`, `null` or nothing.
    Null,
    /// A scalar: its text as written (unquoted, unescaped) and the type YAML gives it.
    Scalar {
        text: String,
        typed: Value,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
    /// A value with a tag (`!something x`), kept as parsed.
    Tagged(Value),
}

/// Whether some mapping of `document` has a `<<` key.
pub(crate) fn has_merge_keys(document: &Value) -> bool {
    match document {
        Value::Mapping(mapping) => mapping.iter().any(|(key, value)| key.as_str() == Some("<<") || has_merge_keys(value)),
        Value::Sequence(items) => items.iter().any(has_merge_keys),
        Value::Tagged(tagged) => has_merge_keys(&tagged.value),
        _ => false,
    }
}

/// Reads `text` (already parsed as `document`) into a merged [`Node`] tree.
pub(crate) fn read(text: &str, document: &Value) -> Result<Node, Error> {
    let mut node = Guide(document).deserialize(serde_norway::Deserializer::from_str(text))?;
    apply_merge(&mut node)?;
    Ok(node)
}

/// Deserializes the node `self.0` describes, asking for scalars as text.
struct Guide<'v>(&'v Value);

impl<'de> DeserializeSeed<'de> for Guide<'_> {
    type Value = Node;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        match self.0 {
            Value::Mapping(mapping) => deserializer.deserialize_map(MapGuide(mapping)),
            Value::Sequence(items) => deserializer.deserialize_seq(SeqGuide(items)),
            Value::Null => deserializer.deserialize_ignored_any(IgnoredAny).map(|_| Node::Null),
            Value::Tagged(_) => deserializer.deserialize_ignored_any(IgnoredAny).map(|_| Node::Tagged(self.0.clone())),
            typed => deserializer.deserialize_str(TextVisitor).map(|text| Node::Scalar { text, typed: typed.clone() }),
        }
    }
}

struct TextVisitor;

impl Visitor<'_> for TextVisitor {
    type Value = String;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a scalar")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<String, E> {
        Ok(value.to_owned())
    }
}

/// The two reads of one text disagree: not expected, said plainly if it happens.
fn diverged<E: de::Error>() -> E {
    E::custom("the file changed while it was being read; run the command again")
}

struct MapGuide<'v>(&'v Mapping);

impl<'de> Visitor<'de> for MapGuide<'_> {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a mapping")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Node, A::Error> {
        let mut entries = Vec::with_capacity(self.0.len());
        for (key, value) in self.0 {
            let key = access.next_key_seed(Guide(key))?.ok_or_else(diverged)?;
            entries.push((key, access.next_value_seed(Guide(value))?));
        }
        Ok(Node::Map(entries))
    }
}

struct SeqGuide<'v>(&'v [Value]);

impl<'de> Visitor<'de> for SeqGuide<'_> {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Node, A::Error> {
        let mut items = Vec::with_capacity(self.0.len());
        for item in self.0 {
            items.push(access.next_element_seed(Guide(item))?.ok_or_else(diverged)?);
        }
        Ok(Node::Seq(items))
    }
}

impl Node {
    fn is_merge_key(&self) -> bool {
        matches!(self, Node::Scalar { typed: Value::String(text), .. } if text == "<<")
    }

    /// Whether two mapping keys are the same key (by their YAML value, as `apply_merge` compares).
    fn same_key(&self, other: &Node) -> bool {
        match (self, other) {
            (Node::Scalar { typed: a, .. }, Node::Scalar { typed: b, .. }) => a == b,
            (Node::Null, Node::Null) => true,
            _ => false,
        }
    }

    fn into_value(self) -> Value {
        match self {
            Node::Null => Value::Null,
            Node::Scalar { typed, .. } => typed,
            Node::Seq(items) => Value::Sequence(items.into_iter().map(Node::into_value).collect()),
            Node::Map(entries) => Value::Mapping(entries.into_iter().map(|(key, value)| (key.into_value(), value.into_value())).collect()),
            Node::Tagged(value) => value,
        }
    }
}

/// Merges every `<<` as PyYAML does: a key written in the mapping wins; of a list of merged
/// mappings, the earlier wins; a merged mapping's own `<<` is merged first (serde_norway's
/// `apply_merge` leaves that one in place).
fn apply_merge(node: &mut Node) -> Result<(), Error> {
    match node {
        Node::Map(entries) => {
            for (_, value) in entries.iter_mut() {
                apply_merge(value)?;
            }
            let (merges, mut own): (Vec<_>, Vec<_>) = std::mem::take(entries).into_iter().partition(|(key, _)| key.is_merge_key());
            for (_, source) in merges {
                let sources = match source {
                    Node::Map(source) => vec![source],
                    Node::Seq(items) => items
                        .into_iter()
                        .map(|item| match item {
                            Node::Map(source) => Ok(source),
                            _ => Err(merge_error()),
                        })
                        .collect::<Result<_, _>>()?,
                    _ => return Err(merge_error()),
                };
                for (key, value) in sources.into_iter().flatten() {
                    if !own.iter().any(|(written, _)| written.same_key(&key)) {
                        own.push((key, value));
                    }
                }
            }
            *entries = own;
            Ok(())
        }
        Node::Seq(items) => items.iter_mut().try_for_each(apply_merge),
        _ => Ok(()),
    }
}

fn merge_error() -> Error {
    de::Error::custom("`<<` merges a mapping or a list of mappings (`<<: *defaults` or `<<: [*a, *b]`)")
}

impl<'de> IntoDeserializer<'de, Error> for Node {
    type Deserializer = Node;

    fn into_deserializer(self) -> Node {
        self
    }
}

impl<'de> Deserializer<'de> for Node {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self {
            Node::Null => visitor.visit_unit(),
            Node::Scalar { typed: Value::Bool(value), .. } => visitor.visit_bool(value),
            Node::Scalar { typed: Value::Number(number), text } => match (number.as_u64(), number.as_i64(), number.as_f64()) {
                (Some(value), _, _) => visitor.visit_u64(value),
                (None, Some(value), _) => visitor.visit_i64(value),
                (None, None, Some(value)) => visitor.visit_f64(value),
                (None, None, None) => visitor.visit_string(text),
            },
            Node::Scalar { text, .. } => visitor.visit_string(text),
            Node::Seq(items) => {
                let mut access = SeqDeserializer::new(items.into_iter());
                let value = visitor.visit_seq(&mut access)?;
                access.end()?;
                Ok(value)
            }
            Node::Map(entries) => {
                let mut access = MapDeserializer::new(entries.into_iter());
                let value = visitor.visit_map(&mut access)?;
                access.end()?;
                Ok(value)
            }
            Node::Tagged(value) => value.deserialize_any(visitor),
        }
    }

    /// Text is the scalar as written, whatever YAML type it has (`3.10`, `12345`, `yes`).
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self {
            Node::Scalar { text, .. } => visitor.visit_string(text),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self {
            Node::Null => visitor.visit_none(),
            other => visitor.visit_some(other),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self {
            Node::Scalar { text, .. } => visitor.visit_enum(StringDeserializer::<Error>::new(text)),
            other => other.into_value().deserialize_enum(name, variants, visitor),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 bytes byte_buf unit unit_struct seq tuple
        tuple_struct map struct
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(text: &str) -> Value {
        let document: Value = serde_norway::from_str(text).expect("parses");
        read(text, &document).expect("merges").into_value()
    }

    #[test]
    fn merges_like_apply_merge() {
        for text in [
            "a: &a {x: 1, y: 2}\nb: &b {y: 3, z: 4}\nc:\n  <<: [*a, *b]\n  x: 0\nd: {<<: *b}\n",
            "d: &d\n  a: !!str 3.10\n  b: !custom x\n  ~: y\n  c: [1, {e: 2}]\n  f: |\n    <<SYS>>\ne: {<<: *d, a: 1}\nl:\n  - <<: *d\n",
        ] {
            let mut expected: Value = serde_norway::from_str(text).expect("parses");
            expected.apply_merge().expect("merges");
            assert_eq!(merged(text), expected, "{text}");
        }
        // A merged mapping that itself merges is merged whole, as PyYAML does (serde_norway's
        // `apply_merge` leaves the inner `<<` in place).
        let nested = merged("a: &a {x: 1}\nb: &b {<<: *a, y: 2}\nc: {<<: *b, z: 3}\n");
        let expected: Value = serde_norway::from_str("a: {x: 1}\nb: {y: 2, x: 1}\nc: {z: 3, y: 2, x: 1}\n").expect("parses");
        assert_eq!(nested, expected);
    }

    #[test]
    fn scalars_keep_their_text() {
        let text = "d: &d {v: 3.10, k: 0012, b: yes, n: ~, q: '3.10'}\ne:\n  <<: *d\n  w: 1e3\n";
        let document: Value = serde_norway::from_str(text).expect("parses");
        let Node::Map(entries) = read(text, &document).expect("reads") else { panic!("a mapping") };
        let Some((_, Node::Map(e))) =
            entries.into_iter().find(|(key, _)| key.same_key(&Node::Scalar { text: "e".into(), typed: "e".into() }))
        else {
            panic!("e is a mapping")
        };
        let texts: Vec<(String, Option<String>)> = e
            .into_iter()
            .map(|(key, value)| match (key, value) {
                (Node::Scalar { text: key, .. }, Node::Scalar { text, .. }) => (key, Some(text)),
                (Node::Scalar { text: key, .. }, _) => (key, None),
                _ => panic!("scalar keys"),
            })
            .collect();
        let expected = [("w", Some("1e3")), ("v", Some("3.10")), ("k", Some("0012")), ("b", Some("yes")), ("n", None), ("q", Some("3.10"))];
        let expected: Vec<(String, Option<String>)> =
            expected.iter().map(|(key, text)| ((*key).to_owned(), text.map(str::to_owned))).collect();
        assert_eq!(texts, expected);
    }

    #[test]
    fn detection_is_structural() {
        let parse = |text: &str| serde_norway::from_str::<Value>(text).expect("parses");
        assert!(has_merge_keys(&parse("a: &a {x: 1}\nb: {<<: *a}\n")));
        assert!(has_merge_keys(&parse("l:\n  - <<: {x: 1}\n")));
        assert!(!has_merge_keys(&parse("prompt: |\n  <<SYS>> hello\n")));
        assert!(!has_merge_keys(&parse("text: \"<<: not a key\"\n")));
    }

    #[test]
    fn merging_a_scalar_is_an_error() {
        let text = "a:\n  <<: 3\n";
        let document: Value = serde_norway::from_str(text).expect("parses");
        let error = read(text, &document).expect_err("a scalar merge");
        assert!(error.to_string().contains("mapping or a list of mappings"), "{error}");
    }
}
